"""Process helpers shared by the tests: waiting for processes to be gone, on pidfds (no
polling), for the tests that prove no worker outlives its supervisor, its parent or its failed
step; running a Python snippet in a fresh interpreter; running a job script that prints
``RESULT {json}`` lines; the one environment without launcher variables that every command a
test starts gets (:func:`launcher_free_environ`); and :func:`free_port`.

Importable from any test module: tests/conftest.py puts this folder on ``sys.path``.
"""

from __future__ import annotations

import json
import os
import select
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

#: prefixes of the variables of a launcher (Slurm, the MPIs, LSF, PBS and PALS, JSM, Horovod,
#: torchrun's agent, unirank's own) that a command a test starts must not inherit from the
#: shell running pytest
LAUNCHER_PREFIXES = ("SLURM", "SRUN_", "SBATCH_", "SALLOC_", "OMPI_", "PMI", "MPI_", "HYDRA_",
                     "I_MPI_", "MV2_", "JSM_", "LSB_", "PBS_", "PALS_", "HOROVOD_",
                     "TORCHELASTIC_", "UNIRANK_", "GROUP_", "ROLE_", "MASTER_")
#: torchrun's variables that no prefix above covers
LAUNCHER_NAMES = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"})
#: the one ``UNIRANK_`` variable that commands a test starts do inherit: UNIRANK_NO_PRELOAD, so
#: that the no-preload lane (tests/supervisor/test_no_preload_lane.py) runs the suites that
#: start workers with every worker started as its own interpreter
KEPT_NAMES = frozenset({"UNIRANK_NO_PRELOAD"})


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
