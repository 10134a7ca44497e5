"""Process helpers shared by the tests: waiting for processes to be gone, on pidfds (no
polling), for the tests that prove no worker outlives its supervisor, its parent or its failed
step; running a Python snippet in a fresh interpreter; running a job script that prints
``RESULT {json}`` lines; the one environment without launcher variables that every command a
test starts gets (:func:`launcher_free_environ`); :class:`Runner`, the one way a test starts
``python -m unirank run`` (the ``runner`` fixture of tests/conftest.py); :func:`free_port`; and
the one answer to "is this a CI run" (:func:`in_ci`, :func:`unavailable`).

Importable from any test module: tests/conftest.py puts this folder on ``sys.path``.

Environment variables read: ``CI`` (:func:`in_ci`), and the whole environment, from which
:func:`launcher_free_environ` removes every launcher's variables.
"""

from __future__ import annotations

import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn, Optional

import pytest

#: prefixes of the variables of a launcher (Slurm, the MPIs, LSF, PBS and PALS, JSM, Horovod,
#: torchrun's agent, unirank's own, SkyPilot) that a command a test starts must not inherit from the
#: shell running pytest
LAUNCHER_PREFIXES = ("SLURM", "SRUN_", "SBATCH_", "SALLOC_", "OMPI_", "PMI", "MPI_", "HYDRA_",
                     "I_MPI_", "MV2_", "JSM_", "LSB_", "PBS_", "PALS_", "HOROVOD_",
                     "TORCHELASTIC_", "UNIRANK_", "GROUP_", "ROLE_", "MASTER_", "SKYPILOT_",
                     "PET_")
#: torchrun's variables that no prefix above covers
LAUNCHER_NAMES = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"})
#: the one ``UNIRANK_`` variable that commands a test starts do inherit: UNIRANK_NO_PRELOAD, so
#: that the no-preload lane (tests/supervisor/test_no_preload_lane.py) runs the suites that
#: start workers with every worker started as its own interpreter
KEPT_NAMES = frozenset({"UNIRANK_NO_PRELOAD"})


#: The start of a test program that waits for signals: ``on_signals(SIG, ...)`` gives each a
#: handler that does nothing, and ``next_signal(timeout)`` returns the number of the next one
#: that came (None after ``timeout`` seconds; None waits for ever). The interpreter's C handler
#: writes the number to a pipe (``signal.set_wakeup_fd``), so a signal that comes just before
#: the program starts to wait is not lost: a Python handler writing that pipe itself, or ending
#: a ``signal.pause()``, runs only once the main thread runs Python code again, and a signal
#: that came after the last such moment but before the wait began was slept through (seen
#: under load: a worker that waited out the whole grace period for a SIGTERM it had been sent).
SIGNAL_WAIT = """
import os as _os, select as _select, signal as _signal
_wake_r, _wake_w = _os.pipe()
_os.set_blocking(_wake_w, False)
_signal.set_wakeup_fd(_wake_w)

def on_signals(*signums):
    for signum in signums:
        _signal.signal(signum, lambda signum, frame: None)

def next_signal(timeout=None):
    if not _select.select([_wake_r], [], [], timeout)[0]:
        return None
    return _os.read(_wake_r, 1)[0]
"""


def in_ci(environ: Mapping[str, str] = os.environ) -> bool:
    """True when ``CI`` says this is a CI run. Reads ``CI`` (from ``environ``)."""
    return environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def unavailable(reason: str, details: str = "",
                environ: Mapping[str, str] = os.environ) -> NoReturn:
    """Fail in CI, skip elsewhere, with a one-line ``reason`` (``details`` only in CI's message):
    what a test does when a lane it needs (Slurm, MPI, Horovod, XLA, a peer library) is missing
    (DEVELOPERS.md). Reads ``CI`` (from ``environ``)."""
    if in_ci(environ):
        pytest.fail(f"{reason}\n{details}".rstrip(), pytrace=False)
    pytest.skip(reason)


def launcher_free_environ(extra: Optional[Mapping[str, str]] = None, *,
                          drop: Iterable[str] = (),
                          drop_prefixes: tuple[str, ...] = ()) -> dict[str, str]:
    """This process's environment without any launcher's variables (:data:`LAUNCHER_PREFIXES`,
    :data:`LAUNCHER_NAMES`, but :data:`KEPT_NAMES`), nor the variables named in ``drop`` or
    starting with one of ``drop_prefixes``, updated with ``extra``. Reads the whole
    environment."""
    names = LAUNCHER_NAMES | frozenset(drop)
    prefixes = LAUNCHER_PREFIXES + drop_prefixes
    env = {k: v for k, v in os.environ.items()
           if k not in names and (k in KEPT_NAMES or not k.startswith(prefixes))}
    env.update(extra or {})
    return env


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[Any], timeout: float = 120.0) -> None:
    """Until something accepts connections on the loopback ``port`` (the first node of an
    elastic job serves its endpoint there), or ``proc`` ended; AssertionError after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)  # polling a port: nothing signals a listening socket
    raise AssertionError(f"nothing listened on 127.0.0.1:{port}")


def is_live(pid: int, mark: Optional[bytes] = None) -> bool:
    """True while ``pid`` is a running (not zombie) process, whose command line contains
    ``mark`` when one is given (so that a recycled pid is not mistaken for the old process)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            command = cmdline.read()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z" and (mark is None or mark in command)


def _children() -> dict[int, list[int]]:
    """Every process's children, by parent pid (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(parent, []).append(int(entry))
    return children


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    return _children().get(pid, [])


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    children = _children()
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def wait_gone(pids: Iterable[int], timeout: float = 30.0,
              mark: Optional[bytes] = None) -> list[int]:
    """Wait until none of ``pids`` is live (see :func:`is_live`); return those still live at the
    timeout. Blocks on pidfds, which become readable when a process exits."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    fds: dict[int, int] = {}
    try:
        for pid in pids:
            if not is_live(pid, mark):
                continue
            try:
                fds[os.pidfd_open(pid)] = pid
            except ProcessLookupError:
                continue
        with selectors.DefaultSelector() as selector:
            for fd in fds:
                selector.register(fd, selectors.EVENT_READ)
            waiting = set(fds)
            while waiting:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                for key, _ in selector.select(remaining):
                    selector.unregister(key.fd)
                    waiting.discard(key.fd)
    finally:
        for fd in fds:
            os.close(fd)
    return [pid for pid in pids if is_live(pid, mark)]


def read_stdout_until(proc: subprocess.Popen[bytes], done: Callable[[bytes], bool],
                      timeout: float, what: str) -> bytes:
    """``proc``'s stdout from now until ``done(all read so far)``, read unbuffered (what is not
    read yet stays in the pipe for ``communicate``); fails after ``timeout``, or when stdout
    closes first, naming ``what`` was awaited."""
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + timeout
    while not done(seen):
        left = deadline - time.monotonic()
        assert left > 0, f"no {what} after {timeout:g} s; stdout so far:\n{seen!r}"
        ready, _, _ = select.select([proc.stdout], [], [], left)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, f"stdout closed before {what}:\n{seen!r}"
            seen += chunk
    return seen


def run_to_end(command: Sequence[str], cwd: Path, env: Mapping[str, str], timeout: float,
               stdout: Optional[int] = None) -> tuple[int, subprocess.CompletedProcess[str]]:
    """Run ``command`` (stdin empty, output captured as text) to its end: its pid, and how it
    ended; fails, after killing it, when it runs past ``timeout``."""
    proc = subprocess.Popen(list(command), cwd=cwd, env=dict(env),
                            stdout=subprocess.PIPE if stdout is None else stdout,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=timeout)
        raise AssertionError(f"{command[:4]} did not end in {timeout} s:\n{out}\n{err}") from None
    return proc.pid, subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def assert_snippet_runs(code: str, timeout: float = 60) -> None:
    """Run ``code`` with this interpreter in a fresh process; fail with its stderr unless it
    exits 0 (for checks of what an import pulls in, which the test process has already done)."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr


def run_job(script: Path, *args: str, timeout: float = 120) -> list[dict[str, Any]]:
    """Run ``script`` (which prints one ``RESULT {json}`` line per rank) with this interpreter,
    without launcher variables; fail with its stderr unless it exits 0; return the results
    sorted by their ``rank``."""
    proc = subprocess.run([sys.executable, str(script), *args], env=launcher_free_environ(),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines()
               if line.startswith("RESULT ")]
    return sorted(results, key=lambda result: int(result.get("rank", 0)))


#: ``python -m unirank run`` with this interpreter; a test's arguments follow
UNIRANK_RUN = (sys.executable, "-m", "unirank", "run")
#: how long a ``unirank run`` a test starts may take before it is killed and the test fails
TIMEOUT = 120.0
#: on the command line of every worker (a fresh interpreter's: the interpreter, then the target)
WORKER_MARK = os.fsencode(sys.executable)


class Ended(subprocess.CompletedProcess[str]):
    """How a command ended (its output as text), and the pid it ran as."""

    def __init__(self, args: Sequence[str], pid: int, returncode: int, stdout: str,
                 stderr: str) -> None:
        super().__init__(list(args), returncode, stdout, stderr)
        self.pid = pid


def refusal_line(result: Ended) -> str:
    """The one line ``unirank run`` refused its options with (exit code 2, nothing else on
    stderr)."""
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("unirank run: error: "), result.stderr
    return lines[0]


class Runner:
    """Starts ``python -m unirank run ...`` in a test's folder (:attr:`cwd`), without any
    launcher's variables (:func:`launcher_free_environ`), and reads what it says; :meth:`close`
    kills what :meth:`start` started. The ``runner`` fixture (tests/conftest.py) gives one."""

    timeout = TIMEOUT

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self._started: list[subprocess.Popen[Any]] = []

    @staticmethod
    def command(args: Sequence[str], prefix: Sequence[str] = ()) -> list[str]:
        """The command line of ``unirank run ARGS`` after ``prefix`` (``srun ...``, ``mpirun
        ...``, ``taskset ...``): for a launcher that starts it elsewhere."""
        return [*prefix, *UNIRANK_RUN, *args]

    def script(self, name: str, text: str) -> Path:
        """Write a worker script into the test's folder."""
        path = self.cwd / name
        path.write_text(text)
        return path

    def environ(self, env: Optional[Mapping[str, str]] = None, drop: Iterable[str] = (),
                drop_prefixes: tuple[str, ...] = ()) -> dict[str, str]:
        """The environment ``unirank run`` gets: :func:`launcher_free_environ` of these."""
        return launcher_free_environ(env, drop=drop, drop_prefixes=drop_prefixes)

    def run(self, args: Sequence[str], *, timeout: float = TIMEOUT,
            env: Optional[Mapping[str, str]] = None, drop: Iterable[str] = (),
            drop_prefixes: tuple[str, ...] = (), cwd: Optional[Path] = None,
            prefix: Sequence[str] = (), stdout: Optional[int] = None,
            new_session: bool = False) -> Ended:
        """Run ``unirank run ARGS`` (after ``prefix``) to its end, stdin empty, stdout captured
        or on the fd ``stdout``, in ``cwd`` (default :attr:`cwd`), with ``env`` added to the
        environment and ``drop``/``drop_prefixes`` removed; with ``new_session``, in a session
        of its own. Fails, after killing it (its whole session with ``new_session``), when it
        runs past ``timeout``."""
        command = self.command(args, prefix)
        proc = subprocess.Popen(command, cwd=cwd or self.cwd,
                                env=self.environ(env, drop, drop_prefixes),
                                stdout=subprocess.PIPE if stdout is None else stdout,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                start_new_session=new_session)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            if new_session:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"{' '.join(command)} did not end in {timeout:g} s; killed\n"
                                 f"stdout:\n{out}\nstderr:\n{err}") from None
        return Ended(command, proc.pid, proc.returncode, out, err)

    def start(self, args: Sequence[str] = (), *, env: Optional[Mapping[str, str]] = None,
              command: Optional[Sequence[str]] = None, stdout: Optional[int] = None,
              stderr: Optional[int] = None, stdin: Optional[int] = None,
              drop: Iterable[str] = (), cwd: Optional[Path] = None,
              text: bool = False) -> subprocess.Popen[Any]:
        """Start ``unirank run ARGS`` (or ``command``) in ``cwd`` (default :attr:`cwd`) with
        stdin empty (or the fd ``stdin``), stdout and stderr piped (or on the fds given), bytes
        unless ``text``, without the variables in ``drop``; killed at :meth:`close`."""
        argv = list(command) if command else self.command(args)
        proc = subprocess.Popen(argv, cwd=cwd or self.cwd, env=self.environ(env, drop),
                                stdout=subprocess.PIPE if stdout is None else stdout,
                                stderr=subprocess.PIPE if stderr is None else stderr,
                                stdin=subprocess.DEVNULL if stdin is None else stdin, text=text)
        self._started.append(proc)
        return proc

    @staticmethod
    def read_lines(stream: IO[bytes], count: int, *, contains: str = "",
                   timeout: float = TIMEOUT) -> list[str]:
        """See :func:`read_lines`."""
        return read_lines(stream, count, contains=contains, timeout=timeout)

    @staticmethod
    def wait_gone(pids: Sequence[int], timeout: float = 30.0,
                  mark: bytes = WORKER_MARK) -> list[int]:
        """See :func:`wait_gone`."""
        return wait_gone(pids, timeout, mark)

    def close(self) -> None:
        """Kill what :meth:`start` started and is still running; reap it."""
        for proc in self._started:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=TIMEOUT)


def read_lines(stream: IO[bytes], count: int, *, contains: str = "",
               timeout: float = TIMEOUT) -> list[str]:
    """Read lines from ``stream`` until ``contains`` was seen ``count`` times (two processes
    sharing one pipe may write on one line: ``READY 1READY 0``); fail on timeout
    or end of stream. Returns every line read."""
    fd = stream.fileno()
    os.set_blocking(fd, False)
    lines: list[str] = []
    buffer = b""
    found = 0
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while found < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out after {timeout} s; read so far: {lines}")
            if not selector.select(remaining):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"stream ended; read so far: {lines} {buffer!r}")
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                text = line.decode(errors="replace")
                lines.append(text)
                found += text.count(contains) if contains else 1
    os.set_blocking(fd, True)
    return lines
