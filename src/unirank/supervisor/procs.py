"""Starting, watching and stopping the workers of one node.

One thread, no polling: the supervisor sleeps in ``select`` on the workers' output pipes and on the
signal wakeup fd, where SIGCHLD and the signals it forwards arrive. Each worker runs in its own
session (process group), as under torchrun, so that a terminal's Ctrl-C reaches only the
supervisor, which forwards it once, and so that stopping a worker stops its children too.

* When a worker fails (non-zero exit or death by a signal), the others get SIGTERM, then SIGKILL
  after the grace period; the exit code is the first failure's.
* SIGINT and SIGTERM reaching the supervisor are forwarded to every worker's process group, then
  the same grace period applies (a second one kills at once). SIGUSR1 and SIGUSR2 are forwarded
  to the worker processes only (their children keep the default action, which would kill them).
* Each worker's stderr goes through the supervisor, which keeps its tail for the failure summary.
  With ``tag_output`` stdout does too, and every line gets a ``[rankN]:`` prefix.
* Workers arm PR_SET_PDEATHSIG in their bootstrap, so a supervisor killed by SIGKILL leaves no
  orphans; when the supervisor ends normally it kills whatever is left in the workers' groups.
"""

from __future__ import annotations

import os
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import IO, TYPE_CHECKING, Any, Union

from unirank.errorfile import ERROR_FILE_VAR, failure_time
from unirank.supervisor.listen import open_store_socket
from unirank.supervisor.output import LinePrefixer, tag_for
from unirank.supervisor.plan import STORE_FD_VAR, Plan
from unirank.supervisor.summary import (
    OutputTail,
    RunResult,
    WorkerExit,
    describe_returncode,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    _Handler = Union[Callable[[int, Union[FrameType, None]], Any], int, signal.Handlers, None]

__all__ = ["FORWARDED_SIGNALS", "Supervisor", "WorkerLaunch", "run_plan", "worker_command"]

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: how long to wait for workers to vanish after SIGKILL before giving up on them
KILL_WAIT = 30.0
_CHUNK = 65536


@dataclass(frozen=True)
class WorkerLaunch:
    """How to start one worker."""

    rank: int
    local_rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    pass_fds: tuple[int, ...] = ()
    error_file: str | None = None


class _Stream:
    """One worker output pipe: where its bytes go, how they are tagged, what is kept."""

    def __init__(self, fd: int, target: int, prefixer: LinePrefixer | None,
                 tail: OutputTail | None) -> None:
        self.fd = fd
        self.target = target
        self.prefixer = prefixer
        self.tail = tail


class _Worker:
    def __init__(self, launch: WorkerLaunch, proc: subprocess.Popen[bytes]) -> None:
        self.launch = launch
        self.proc = proc
        self.pid = proc.pid
        self.returncode: int | None = None
        self.tail = OutputTail()

    @property
    def alive(self) -> bool:
        return self.returncode is None


def _ignore(signum: int, frame: FrameType | None) -> None:
    """Installed for the signals the loop handles: they arrive through the wakeup fd."""


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Supervisor:
    """Runs one node's workers to the end (see the module docstring)."""

    def __init__(
        self,
        launches: Sequence[WorkerLaunch],
        *,
        node_name: str,
        tag_output: bool = False,
        grace_period: float = 5.0,
        close_after_start: Sequence[socket.socket] = (),
        out_fd: int = 1,
        err_fd: int = 2,
        prog: str = "unirank run",
        kill_wait: float = KILL_WAIT,
    ) -> None:
        self._launches = list(launches)
        self._node = node_name
        self._tag = tag_output
        self._grace = grace_period
        self._close_after_start = list(close_after_start)
        self._out_fd = out_fd
        self._err_fd = err_fd
        self._prog = prog
        self._kill_wait = kill_wait
        self._workers: list[_Worker] = []
        self._selector = selectors.DefaultSelector()
        self._streams: dict[int, _Stream] = {}
        self._first_failure: _Worker | None = None
        self._stop_signal: int | None = None
        self._deadline: float | None = None
        self._killing = False
        self._unreaped: tuple[int, ...] = ()
        self._broken: set[int] = set()

    # -- public -------------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Start every worker, forward signals, stop the rest on the first failure, and return
        how each ended. Must run in the main thread (it handles signals)."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("the supervisor must run in the main thread (it handles signals)")
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        old_handlers: dict[int, _Handler] = {}
        try:
            for sig in (signal.SIGCHLD, *FORWARDED_SIGNALS):
                old_handlers[int(sig)] = signal.signal(sig, _ignore)
            self._selector.register(wake_r, selectors.EVENT_READ, None)
            self._start_all()
            self._loop(wake_r)
            self._drain()
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for signum, handler in old_handlers.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
            self._cleanup()
            os.close(wake_r)
            os.close(wake_w)
            self._selector.close()
        return self._result()

    # -- starting -----------------------------------------------------------------------------

    def _start_all(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            for launch in self._launches:
                self._start(launch)
        finally:
            for sock in self._close_after_start:
                sock.close()

    def _start(self, launch: WorkerLaunch) -> None:
        proc = subprocess.Popen(
            list(launch.argv),
            env=dict(launch.env),
            stdout=subprocess.PIPE if self._tag else None,
            stderr=subprocess.PIPE,
            pass_fds=launch.pass_fds,
            start_new_session=True,
        )
        worker = _Worker(launch, proc)
        self._workers.append(worker)
        prefix = tag_for(launch.rank) if self._tag else None
        pipes: list[tuple[IO[bytes] | None, int, OutputTail | None]] = [
            (proc.stderr, self._err_fd, worker.tail)
        ]
        if proc.stdout is not None:
            pipes.append((proc.stdout, self._out_fd, None))
        for pipe, target, tail in pipes:
            assert pipe is not None
            fd = pipe.fileno()
            os.set_blocking(fd, False)
            stream = _Stream(fd, target, LinePrefixer(prefix) if prefix else None, tail)
            self._streams[fd] = stream
            self._selector.register(fd, selectors.EVENT_READ, stream)

    # -- the loop -----------------------------------------------------------------------------

    def _alive(self) -> list[_Worker]:
        return [w for w in self._workers if w.alive]

    def _loop(self, wake_r: int) -> None:
        while True:
            self._reap()
            if not self._alive():
                return
            now = time.monotonic()
            if self._deadline is not None and now >= self._deadline:
                if self._killing:
                    self._unreaped = tuple(w.pid for w in self._alive())
                    return
                self._kill_all()
                continue
            timeout = None if self._deadline is None else self._deadline - now
            for key, _events in self._selector.select(timeout):
                if key.data is None:
                    self._on_wakeup(wake_r)
                else:
                    self._pump(key.data)

    def _on_wakeup(self, wake_r: int) -> None:
        try:
            data = os.read(wake_r, 512)
        except BlockingIOError:
            return
        for signum in data:
            if signum in _STOP_SIGNALS:
                self._on_stop_signal(signum)
            elif signum in FORWARDED_SIGNALS:
                for worker in self._alive():
                    _send(worker.pid, signum, group=False)
            # SIGCHLD: the loop reaps after every wakeup

    def _on_stop_signal(self, signum: int) -> None:
        if self._stop_signal is None and self._first_failure is None:
            self._stop_signal = signum
            self._say(
                f"got {_signal_name(signum)}: forwarded to the workers; SIGKILL in "
                f"{self._grace:g} s ({_signal_name(signum)} again to kill now)"
            )
            self._signal_all(signum)
        else:
            self._kill_all()

    def _reap(self) -> None:
        for worker in self._workers:
            if not worker.alive:
                continue
            try:
                pid, status = os.waitpid(worker.pid, os.WNOHANG)
            except ChildProcessError:  # pragma: no cover - reaped elsewhere
                pid, status = worker.pid, 255 << 8
            if pid == 0:
                continue
            code = os.waitstatus_to_exitcode(status)
            worker.returncode = code
            worker.proc.returncode = code
            if code != 0 and self._first_failure is None and self._stop_signal is None:
                self._first_failure = worker
                self._on_first_failure(worker)

    def _on_first_failure(self, worker: _Worker) -> None:
        others = self._alive()
        if not others:
            return
        self._say(
            f"rank {worker.launch.rank} (local rank {worker.launch.local_rank}) on node "
            f"{self._node} ended with {describe_returncode(worker.returncode or 0)}; stopping "
            f"the other {len(others)} worker(s): SIGTERM now, SIGKILL after {self._grace:g} s"
        )
        self._signal_all(signal.SIGTERM)

    def _signal_all(self, signum: int) -> None:
        for worker in self._alive():
            _send(worker.pid, signum, group=True)
        if self._deadline is None:
            self._deadline = time.monotonic() + self._grace

    def _kill_all(self) -> None:
        for worker in self._alive():
            _send(worker.pid, signal.SIGKILL, group=True)
        self._killing = True
        self._deadline = time.monotonic() + self._kill_wait

    # -- output -------------------------------------------------------------------------------

    def _pump(self, stream: _Stream) -> None:
        try:
            data = os.read(stream.fd, _CHUNK)
        except BlockingIOError:
            return
        if not data:
            self._close_stream(stream)
            return
        if stream.tail is not None:
            stream.tail.feed(data)
        self._write(stream.target, stream.prefixer.feed(data) if stream.prefixer else data)

    def _close_stream(self, stream: _Stream) -> None:
        if stream.prefixer is not None:
            self._write(stream.target, stream.prefixer.flush())
        self._selector.unregister(stream.fd)
        del self._streams[stream.fd]
        os.close(stream.fd)

    def _drain(self) -> None:
        """After the last worker ended: pass on what is left in the pipes, without waiting for
        children that may still hold them open."""
        for stream in list(self._streams.values()):
            while True:
                try:
                    data = os.read(stream.fd, _CHUNK)
                except BlockingIOError:
                    break
                if not data:
                    break
                if stream.tail is not None:
                    stream.tail.feed(data)
                self._write(stream.target,
                            stream.prefixer.feed(data) if stream.prefixer else data)
            self._close_stream(stream)

    def _write(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view and fd not in self._broken:
            try:
                written = os.write(fd, view)
            except BlockingIOError:
                select.select([], [fd], [])
                continue
            except (BrokenPipeError, OSError):
                self._broken.add(fd)  # the reader went away: drop this stream's output
                return
            view = view[written:]

    def _say(self, message: str) -> None:
        self._write(self._err_fd, f"{self._prog}: {message}\n".encode())

    # -- the end ------------------------------------------------------------------------------

    def _cleanup(self) -> None:
        """Leave nothing behind: kill workers still running (an error got us here) and whatever
        their process groups still hold, then close the pipes."""
        for worker in self._workers:
            if worker.alive:
                _send(worker.pid, signal.SIGKILL, group=True)
                try:
                    worker.proc.wait(timeout=self._kill_wait)
                    worker.returncode = worker.proc.returncode
                except subprocess.TimeoutExpired:  # pragma: no cover - stuck in the kernel
                    pass
            else:
                _send(worker.pid, signal.SIGKILL, group=True)
        for stream in list(self._streams.values()):
            self._selector.unregister(stream.fd)
            os.close(stream.fd)
        self._streams.clear()

    def _root_cause(self) -> _Worker | None:
        """The failed worker whose error was recorded first (see :mod:`unirank.errorfile`).

        Peers of a rank that raised fail a moment later and may exit before it; the error files'
        timestamps name the cause. Without any, the first worker seen to fail is blamed.
        """
        if self._first_failure is None:
            return None
        timed = []
        for worker in self._workers:
            if worker.returncode in (None, 0) or not worker.launch.error_file:
                continue
            when = failure_time(worker.launch.error_file)
            if when is not None:
                timed.append((when, worker.launch.rank, worker))
        return min(timed, key=lambda item: item[:2])[2] if timed else self._first_failure

    def _result(self) -> RunResult:
        blamed = self._root_cause()
        exits = tuple(
            WorkerExit(
                rank=w.launch.rank,
                local_rank=w.launch.local_rank,
                node=self._node,
                returncode=w.returncode if w.returncode is not None else -int(signal.SIGKILL),
                stderr_tail=tuple(w.tail.lines()) if w is blamed else (),
            )
            for w in self._workers
        )
        first = None
        if blamed is not None:
            first = next(e for e in exits if e.rank == blamed.launch.rank)
        return RunResult(exits=exits, first_failure=first, stop_signal=self._stop_signal,
                         unreaped=self._unreaped)


def _send(pid: int, signum: int, *, group: bool) -> None:
    """Signal a worker (``group``: its whole process group), ignoring ones already gone."""
    try:
        if group:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def worker_command(target: Sequence[str], python: str | None = None) -> tuple[str, ...]:
    """The command line of a worker: the bootstrap, then ``SCRIPT ARGS`` or ``-m MODULE ARGS``."""
    return (python or sys.executable, "-m", "unirank.supervisor.bootstrap", *target)


def run_plan(
    plan: Plan,
    target: Sequence[str],
    *,
    environ: Mapping[str, str],
    tag_output: bool = False,
    grace_period: float = 5.0,
    out_fd: int = 1,
    err_fd: int = 2,
) -> RunResult:
    """Open the store's port (node 0), start this node's workers and supervise them.

    ``target`` is ``[SCRIPT, ARGS...]`` or ``["-m", MODULE, ARGS...]``; ``environ`` the base of
    every worker's environment (see :meth:`Plan.worker_environ`).
    """
    sockets: list[socket.socket] = []
    store_fd: int | None = None
    if plan.hosts_store:
        sock = open_store_socket(plan.master_port, host=plan.master_addr, option="MASTER_PORT")
        sockets.append(sock)
        store_fd = sock.fileno()
        plan = plan.with_port(int(sock.getsockname()[1]))
    argv = worker_command(target)
    launches = []
    me = os.getpid()
    error_dir = tempfile.mkdtemp(prefix="unirank-run-")
    try:
        for local_rank in range(plan.nproc_per_node):
            rank = plan.global_rank(local_rank)
            env = plan.worker_environ(local_rank, environ, supervisor_pid=me,
                                      tag_output=tag_output)
            # as torchrun: one error file per worker, where @record / unirank write the failure
            error_file = os.path.join(error_dir, str(rank), "error.json")
            env[ERROR_FILE_VAR] = error_file
            fds: tuple[int, ...] = ()
            if store_fd is not None and local_rank == 0:
                env[STORE_FD_VAR] = str(store_fd)
                fds = (store_fd,)
            launches.append(WorkerLaunch(rank, local_rank, argv, env, fds, error_file))
        try:
            supervisor = Supervisor(
                launches, node_name=plan.node_name, tag_output=tag_output,
                grace_period=grace_period, close_after_start=sockets, out_fd=out_fd,
                err_fd=err_fd,
            )
        except BaseException:
            for sock in sockets:
                sock.close()
            raise
        return supervisor.run()
    finally:
        shutil.rmtree(error_dir, ignore_errors=True)
