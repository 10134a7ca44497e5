"""The one process engine: starting, watching and stopping the workers of one node.

``unirank run`` and :class:`~unirank.runtime.parallel.Parallel` both start their workers here.
One thread, no polling: the supervisor sleeps in ``select`` on the workers' output pipes and on
the signal wakeup fd, where SIGCHLD and the signals it forwards arrive. Each worker runs in its
own session (process group), as under torchrun, so that a terminal's Ctrl-C reaches only the
supervisor, which forwards it once, and so that stopping a worker stops its children too.

* When a worker fails (non-zero exit or death by a signal), the others get SIGTERM, then SIGKILL
  after the grace period. The root cause is the worker that failed first on its own, whatever
  order the exits are seen in (:meth:`Supervisor._root_cause`): its failure's time is the one
  it recorded (its ``TORCHELASTIC_ERROR_FILE``, written the moment its program raised or
  exited), else when its end was seen; a failure recorded as a lost peer (gloo's "Connection
  closed by peer"...) counts only when no rank failed on its own account, and a worker stopped
  by this teardown (ended by the signal it was sent, or recorded after it) never does. The
  exit code is the root cause's.
* The signals to forward (default SIGINT, SIGTERM, SIGUSR1, SIGUSR2) go to every worker; SIGINT
  and SIGTERM then start the same grace period (a second one kills at once). Under Slurm
  (SLURM_JOB_ID set) SIGTERM starts none and a second one is only forwarded: Slurm sends it to
  every process of the step and SIGKILL KillWait seconds later, which is the workers' time to
  save a checkpoint.
* Each worker's stdout and stderr go through the supervisor, which passes them on in whole lines
  (:class:`~unirank.supervisor.output.LineBuffer`, :class:`~unirank.supervisor.rows.RankRows`),
  draws progress bars in place on a terminal and as a few lines elsewhere
  (:mod:`~unirank.supervisor.console`), tags them, filters them
  (``--local-ranks-filter``), writes them to log files (``--redirects``, ``--tee``, torchrun's
  ``<log_dir>/<run_id>/attempt_<n>/<local_rank>/``) and keeps stderr's tail for the failure
  summary.
* With ``max_restarts`` a failed group is stopped and started again, TORCHELASTIC_RESTART_COUNT
  counting up; every attempt's root cause goes into the summary.
* A worker that exits with :data:`~unirank.sbatch.requeue.REQUEUE_EXIT_CODE` (79) saved its
  checkpoint and stopped to run again: no failure, no teardown. When every worker ended with 0
  or 79 the run's exit code is 79 (one line, no failure summary). ``max_restarts`` restarts
  such a group too, except under Slurm (SLURM_JOB_ID set), where 79 is passed on for the batch
  script to requeue the job.
* Workers arm PR_SET_PDEATHSIG in their bootstrap, so a supervisor killed by SIGKILL leaves no
  orphans; when the supervisor ends it kills whatever is left in the workers' groups.
* The worker that hosts the rendezvous store (rank 0) gets the read end of a *linger pipe*; the
  supervisor closes it once every other worker has ended, and the host's bootstrap waits for
  that before it ends, so the store outlives every local rank's use of it.
"""

from __future__ import annotations

import contextlib
import json
import math
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
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import TYPE_CHECKING, Any, Union

from unirank.contract import DEFAULT_GRACE_PERIOD
from unirank.errorfile import read_failure
from unirank.launchers import slurm_vars
from unirank.resolve import require_own
from unirank.sbatch.requeue import REQUEUE_EXIT_CODE
from unirank.supervisor.console import LogView, TerminalView
from unirank.supervisor.fork.client import ForkServer, fallback_line, server_environ
from unirank.supervisor.listen import open_store_socket
from unirank.supervisor.output import LineBuffer, OutputOptions
from unirank.supervisor.plan import Plan, Worker
from unirank.supervisor.rows import RankRows
from unirank.supervisor.summary import (
    OutputTail,
    RunResult,
    WorkerExit,
    describe_returncode,
    exit_code_of,
    signal_name,
)
from unirank.supervisor.workerenv import WorkerWiring, worker_environ

if TYPE_CHECKING:
    from collections.abc import Callable

    _Handler = Union[Callable[[int, Union[FrameType, None]], Any], int, signal.Handlers, None]

__all__ = ["DEFAULT_SIGNALS", "EngineOptions", "Supervisor", "WorkerLaunch", "attempt_launches",
           "run_plan", "worker_command"]

DEFAULT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: the selector's mark for the fork server's socket
_SERVER = object()
#: how long to wait for workers to vanish after SIGKILL before giving up on them
KILL_WAIT = 30.0
_CHUNK = 65536


@dataclass(frozen=True)
class EngineOptions:
    """How the engine runs a plan (everything but the layout)."""

    grace_period: float = DEFAULT_GRACE_PERIOD
    output: OutputOptions = field(default_factory=OutputOptions)
    signals: tuple[int, ...] = tuple(int(s) for s in DEFAULT_SIGNALS)
    prog: str = "unirank run"
    #: ``--timeline``: print the start-up timeline (node 0); ``--timeline-json``: write it
    timeline: bool = False
    timeline_json: str | None = None


@dataclass(frozen=True)
class WorkerLaunch:
    """How to start one worker, and where its output goes."""

    rank: int
    local_rank: int
    argv: tuple[str, ...]
    plan: Plan
    worker: Worker
    #: the base of its environment (see :func:`~unirank.supervisor.workerenv.worker_environ`)
    base: Mapping[str, str]
    #: the engine's wiring known before the start; the pipes and the start time come at it
    wiring: WorkerWiring = field(default_factory=WorkerWiring)
    #: ``--timeline``: tell the worker when it was started
    timeline: bool = False
    #: where stdout / stderr go besides the tail: console fd (or None) and log file (or None)
    stdout_console: bool = True
    stderr_console: bool = True
    stdout_file: str | None = None
    stderr_file: str | None = None
    prefix: bytes | None = None

    @property
    def target(self) -> tuple[str, ...]:
        """What follows the bootstrap on the command line (see :func:`worker_command`)."""
        return self.argv[len(worker_command(())):]

    @property
    def error_file(self) -> str | None:
        """Where the worker records its failure."""
        return self.wiring.error_file

    @property
    def hosts_store(self) -> bool:
        """This worker hosts the store: it gets the read end of the linger pipe."""
        return self.wiring.store_fd is not None

    def environ(self, *, linger_fd: int | None, done_fd: int | None,
                started: float) -> dict[str, str]:
        """The worker's complete environment, once its pipes exist (``started``: now)."""
        wiring = replace(self.wiring, linger_fd=linger_fd, done_fd=done_fd,
                         timeline_start=started if self.timeline else None)
        return worker_environ(self.plan, self.worker, self.base, wiring)


class _Stream:
    """One worker output pipe: where its lines go, how they are tagged, what is kept."""

    def __init__(self, fd: int, key: int, targets: list[int], prefix: bytes | None,
                 tail: OutputTail | None) -> None:
        self.fd = fd
        #: its place among the node's streams (a terminal shows live rows in this order)
        self.key = key
        self.targets = targets
        self.prefix = (prefix or b"").decode("utf-8", "surrogateescape")
        self.lines = LineBuffer()
        self.rows = RankRows()
        self.tail = tail


class _Worker:
    def __init__(self, launch: WorkerLaunch, pid: int,
                 proc: subprocess.Popen[bytes] | None) -> None:
        self.launch = launch
        #: None when the fork server forked it (it reports the exit)
        self.proc = proc
        self.pid = pid
        self.returncode: int | None = None
        self.tail = OutputTail()
        #: when (time.time()) the supervisor first signalled this worker to stop, if it did
        self.stopped_at: float | None = None
        #: the signals the teardown sent it (SIGTERM, SIGKILL)
        self.stop_signals: set[int] = set()
        #: when (time.time()) the supervisor saw it end
        self.ended_at: float | None = None
        #: its program ended (it closed its done pipe), though the process may still be exiting
        self.program_done = False

    @property
    def alive(self) -> bool:
        return self.returncode is None


def _ignore(signum: int, frame: FrameType | None) -> None:
    """Installed for the signals the loop handles: they arrive through the wakeup fd."""


class Supervisor:
    """Runs one node's workers to the end (see the module docstring)."""

    def __init__(
        self,
        launches: Sequence[WorkerLaunch],
        *,
        node_name: str,
        grace_period: float = DEFAULT_GRACE_PERIOD,
        signals: Sequence[int] = DEFAULT_SIGNALS,
        out_fd: int = 1,
        err_fd: int = 2,
        prog: str = "unirank run",
        kill_wait: float = KILL_WAIT,
        server: ForkServer | None = None,
        slurm_kills: bool = False,
    ) -> None:
        self._launches = list(launches)
        #: the node's fork server (None: every worker starts as its own interpreter)
        self._server = server
        self._node = node_name
        self._grace = grace_period
        self._signals = tuple(int(s) for s in signals)
        self._out_fd = out_fd
        self._err_fd = err_fd
        self._prog = prog
        self._kill_wait = kill_wait
        #: under Slurm, whose SIGTERM comes with a SIGKILL KillWait seconds later
        self._slurm_kills = slurm_kills
        self._workers: list[_Worker] = []
        self._selector = selectors.DefaultSelector()
        self._streams: dict[int, _Stream] = {}
        #: what each output fd writes to (fds 1 and 2 are often one terminal), and how the
        #: streams that share it are shown there
        self._sinks: dict[int, tuple[int, int]] = {}
        self._views: dict[tuple[int, int], TerminalView | LogView] = {}
        self._files: list[int] = []
        self._first_failure: _Worker | None = None
        self._stop_signal: int | None = None
        self._deadline: float | None = None
        self._killing = False
        self._unreaped: tuple[int, ...] = ()
        self._broken: set[int] = set()
        #: the write end of the store host's linger pipe, closed when the others have ended
        self._linger: int | None = None
        #: read ends of the other workers' done pipes
        self._done_pipes: dict[int, _Worker] = {}

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
            for sig in {int(signal.SIGCHLD), *self._signals}:
                old_handlers[sig] = signal.signal(sig, _ignore)
            self._selector.register(wake_r, selectors.EVENT_READ, None)
            if self._server is not None and not self._server.gone:
                self._selector.register(self._server.fileno(), selectors.EVENT_READ, _SERVER)
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
        for launch in self._launches:
            self._start(launch)
        self._release_store_host()

    def _release_store_host(self) -> None:
        """Close the linger pipe once every worker but the store's host has ended."""
        if self._linger is not None and not any(
                w.alive and not w.program_done for w in self._workers
                if not w.launch.hosts_store):
            os.close(self._linger)
            self._linger = None

    def _open_log(self, path: str | None) -> list[int]:
        if path is None:
            return []
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        self._files.append(fd)
        return [fd]

    def _start(self, launch: WorkerLaunch) -> None:
        out_targets = ([self._out_fd] if launch.stdout_console else [])
        out_targets += self._open_log(launch.stdout_file)
        err_targets = ([self._err_fd] if launch.stderr_console else [])
        err_targets += self._open_log(launch.stderr_file)
        store_fds = () if launch.wiring.store_fd is None else (launch.wiring.store_fd,)
        linger_read = done_write = done_read = None
        if launch.hosts_store:
            linger_read, self._linger = os.pipe()
        else:
            done_read, done_write = os.pipe()
        fds = (*store_fds, *(fd for fd in (linger_read, done_write) if fd is not None))
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        try:
            env = launch.environ(linger_fd=linger_read, done_fd=done_write, started=time.time())
            pid, proc = self._spawn(launch, env, (out_write, err_write), fds)
        except BaseException:
            for fd in (done_read, out_read, err_read):
                if fd is not None:
                    os.close(fd)
            raise
        finally:
            for fd in (linger_read, done_write, out_write, err_write):
                if fd is not None:
                    os.close(fd)
        worker = _Worker(launch, pid, proc)
        self._workers.append(worker)
        if done_read is not None:
            os.set_blocking(done_read, False)
            self._done_pipes[done_read] = worker
            self._selector.register(done_read, selectors.EVENT_READ, worker)
        for fd, targets, tail in ((err_read, err_targets, worker.tail),
                                  (out_read, out_targets, None)):
            os.set_blocking(fd, False)
            for target in targets:
                self._view(target)
            stream = _Stream(fd, 2 * launch.local_rank + (tail is not None), targets,
                             launch.prefix, tail)
            self._streams[fd] = stream
            self._selector.register(fd, selectors.EVENT_READ, stream)

    def _spawn(self, launch: WorkerLaunch, env: dict[str, str], stdio: tuple[int, int],
               fds: tuple[int, ...]) -> tuple[int, subprocess.Popen[bytes] | None]:
        """Fork the worker from the fork server or, where it cannot, start it as its own
        interpreter (saying why once); its pid, and its Popen in the second case."""
        server = self._server
        if server is not None:
            why = server.why_not(env)
            if why is None:
                answer = server.spawn(launch.target, env,
                                      [(stdio[0], 1), (stdio[1], 2), *((fd, fd) for fd in fds)])
                if isinstance(answer, int):
                    return answer, None
                why = answer
            if not server.told:
                server.told = True
                self._say(fallback_line(why))
        proc = subprocess.Popen(list(launch.argv), env=env, stdout=stdio[0], stderr=stdio[1],
                                pass_fds=fds, start_new_session=True)
        return proc.pid, proc

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
            for key, _events in self._selector.select(self._timeout(now)):
                if key.data is None:
                    self._on_wakeup(wake_r)
                elif key.data is _SERVER:
                    self._on_server()
                elif isinstance(key.data, _Worker):
                    self._on_done(key.fd)
                else:
                    self._pump(key.data)
            self._flush_partial_lines(time.monotonic())

    def _timeout(self, now: float) -> float | None:
        """How long the loop may sleep: until the grace period ends or a partial line is due."""
        due = [d for d in (s.lines.deadline for s in self._streams.values()) if d is not None]
        if self._deadline is not None:
            due.append(self._deadline)
        return max(0.0, min(due) - now) if due else None

    def _on_done(self, fd: int) -> None:
        """A worker closed its done pipe (or ended): its program no longer uses the store."""
        try:
            if os.read(fd, 512):
                return  # nobody writes; ignore stray bytes
        except BlockingIOError:
            return
        except OSError:
            pass
        self._done_pipes.pop(fd).program_done = True
        self._selector.unregister(fd)
        os.close(fd)
        self._release_store_host()

    def _on_server(self) -> None:
        """The fork server reported exits, or ended (its workers die with it)."""
        assert self._server is not None
        self._server.read_events()
        if self._server.gone:
            self._selector.unregister(self._server.fileno())
            if any(w.alive and w.proc is None for w in self._workers):
                self._say("the fork server ended; the workers forked from it were killed")

    def _on_wakeup(self, wake_r: int) -> None:
        try:
            data = os.read(wake_r, 512)
        except BlockingIOError:
            return
        for signum in data:
            if signum in _STOP_SIGNALS and signum in self._signals:
                self._on_stop_signal(signum)
            elif signum in self._signals:
                for worker in self._alive():
                    _send(worker.pid, signum, group=False)
            # SIGCHLD: the loop reaps after every wakeup

    def _on_stop_signal(self, signum: int) -> None:
        # Slurm sends SIGTERM to every process of the step (srun passes on its own too) and
        # SIGKILL after KillWait: the workers get that long to save, no deadline of ours
        slurms = self._slurm_kills and signum == signal.SIGTERM
        if self._stop_signal is None and self._first_failure is None:
            self._stop_signal = signum
            if not slurms:
                self._say(
                    f"got {signal_name(signum)}: forwarded to the workers; SIGKILL in "
                    f"{self._grace:g} s ({signal_name(signum)} again to kill now)"
                )
            self._signal_all(signum, deadline=not slurms)
        elif slurms:
            self._signal_all(signum, deadline=False)
        else:
            self._kill_all()

    def _exit_code(self, worker: _Worker) -> int | None:
        """How ``worker`` ended, or None while it runs."""
        if worker.proc is None:
            assert self._server is not None
            code = self._server.exit_code(worker.pid)
            if code is None and self._server.gone:
                code = -int(signal.SIGKILL)  # its parent-death signal
            return code
        try:
            pid, status = os.waitpid(worker.pid, os.WNOHANG)
        except ChildProcessError:  # pragma: no cover - reaped elsewhere
            pid, status = worker.pid, 255 << 8
        if pid == 0:
            return None
        code = os.waitstatus_to_exitcode(status)
        worker.proc.returncode = code
        return code

    def _reap(self) -> None:
        for worker in self._workers:
            if not worker.alive:
                continue
            code = self._exit_code(worker)
            if code is None:
                continue
            worker.returncode = code
            worker.ended_at = time.time()
            if (code not in (0, REQUEUE_EXIT_CODE) and self._first_failure is None
                    and self._stop_signal is None):
                self._first_failure = worker
                self._on_first_failure(worker)
        self._release_store_host()

    def _on_first_failure(self, worker: _Worker) -> None:
        others = self._alive()
        if not others:
            return
        record = read_failure(worker.launch.error_file) if worker.launch.error_file else None
        if record is not None and record.config_error:  # its one line says it all
            self._signal_all(signal.SIGTERM)
            return
        self._say(
            f"rank {worker.launch.rank} (local rank {worker.launch.local_rank}) on node "
            f"{self._node} ended with {describe_returncode(worker.returncode or 0)}; stopping "
            f"the other {len(others)} worker(s): SIGTERM now, SIGKILL after {self._grace:g} s"
        )
        self._signal_all(signal.SIGTERM)

    def _signal_all(self, signum: int, *, deadline: bool = True) -> None:
        now = time.time()
        for worker in self._alive():
            if worker.stopped_at is None:
                worker.stopped_at = now
            worker.stop_signals.add(int(signum))
            _send(worker.pid, signum, group=True)
        if deadline and self._deadline is None:
            self._deadline = time.monotonic() + self._grace

    def _kill_all(self) -> None:
        now = time.time()
        for worker in self._alive():
            if worker.stopped_at is None:
                worker.stopped_at = now
            worker.stop_signals.add(int(signal.SIGKILL))
            _send(worker.pid, signal.SIGKILL, group=True)
        self._killing = True
        self._deadline = time.monotonic() + self._kill_wait

    # -- output -------------------------------------------------------------------------------

    def _feed(self, stream: _Stream, data: bytes) -> None:
        if stream.tail is not None:
            stream.tail.feed(data)
        self._show(stream, stream.lines.feed(data, time.monotonic()))

    def _show(self, stream: _Stream, chunk: bytes, *, end: bool = False) -> None:
        """Apply ``chunk`` to the stream's rows and show what changed on each of its targets
        (see :mod:`.console`); ``end``: the stream ended."""
        if not chunk and not end:
            return
        lines = stream.rows.feed(chunk)
        if end:
            lines += stream.rows.close()
        live = [] if end else stream.rows.live()
        now = time.monotonic()
        for target in stream.targets:
            self._write(target, self._view(target).update(stream.key, stream.prefix, lines,
                                                          live, now))

    def _view(self, fd: int) -> TerminalView | LogView:
        """How ``fd``'s sink shows the streams, its terminal's width brought up to date."""
        sink = self._sinks.get(fd)
        if sink is None:
            sink = self._sinks[fd] = _sink_of(fd)
        view = self._views.get(sink)
        if view is None:
            view = self._views[sink] = TerminalView() if os.isatty(fd) else LogView()
        if isinstance(view, TerminalView):
            with contextlib.suppress(OSError):
                view.width = os.get_terminal_size(fd).columns
        return view

    def _flush_partial_lines(self, now: float) -> None:
        """Pass on the partial lines held for ``PARTIAL_LINE_DELAY`` (see :mod:`.output`)."""
        for stream in list(self._streams.values()):
            deadline = stream.lines.deadline
            if deadline is not None and deadline <= now:
                self._show(stream, stream.lines.flush_partial())

    def _pump(self, stream: _Stream) -> None:
        try:
            data = os.read(stream.fd, _CHUNK)
        except BlockingIOError:
            return
        if not data:
            self._close_stream(stream)
            return
        self._feed(stream, data)

    def _close_stream(self, stream: _Stream) -> None:
        self._show(stream, stream.lines.flush_partial(), end=True)
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
                self._feed(stream, data)
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
        self._write(self._err_fd, self._view(self._err_fd).update(
            -1, "", [f"{self._prog}: {message}"], [], time.monotonic()))

    # -- the end ------------------------------------------------------------------------------

    def _cleanup(self) -> None:
        """Leave nothing behind: kill workers still running (an error got us here) and whatever
        their process groups still hold (rank 0's store), then close pipes and log files."""
        for worker in self._workers:
            _send(worker.pid, signal.SIGKILL, group=True)
        forked = [w.pid for w in self._workers if w.alive and w.proc is None]
        if forked and self._server is not None:
            self._server.wait_exits(forked, self._kill_wait)
        for worker in self._workers:
            if worker.alive and worker.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the kernel
                    worker.returncode = worker.proc.wait(timeout=self._kill_wait)
            elif worker.alive:
                worker.returncode = self._exit_code(worker)
        for stream in list(self._streams.values()):
            self._selector.unregister(stream.fd)
            os.close(stream.fd)
        self._streams.clear()
        for fd in self._files:
            os.close(fd)
        self._files.clear()
        if self._linger is not None:
            os.close(self._linger)
            self._linger = None
        for fd in self._done_pipes:
            self._selector.unregister(fd)
            os.close(fd)
        self._done_pipes.clear()

    def _root_cause(self) -> tuple[_Worker, bool] | None:
        """The root cause, and whether it ended on its own (else it was stopped while failing).

        Candidates are the failed workers that failed on their own: a worker that recorded its
        error (see :mod:`unirank.errorfile`) before this supervisor signalled it, or one without
        a record that did not end by a signal the teardown sent it (a worker killed by, say,
        SIGSEGV may be seen to end after the teardown signalled it). The earliest failure wins:
        a record's time, else when the end was seen; failures recorded as a lost peer come
        after all others (they are the consequence of another rank's failure, and may be
        recorded or seen first). Without candidates, the first worker seen to fail.
        """
        if self._first_failure is None:
            return None
        ranked = [(key, worker) for worker in self._workers
                  if (key := _failure_key(worker)) is not None]
        if not ranked:
            return self._first_failure, True
        worker = min(ranked, key=lambda item: item[0])[1]
        return worker, worker.stopped_at is None

    def _result(self) -> RunResult:
        cause = self._root_cause()
        blamed = cause[0] if cause else None
        exits = []
        for w in self._workers:
            record = read_failure(w.launch.error_file) if (
                w.launch.error_file and w.returncode not in (None, 0)) else None
            exits.append(WorkerExit(
                rank=w.launch.rank,
                local_rank=w.launch.local_rank,
                node=self._node,
                returncode=w.returncode if w.returncode is not None else -int(signal.SIGKILL),
                stderr_tail=tuple(w.tail.lines()) if w is blamed else (),
                error=record.message if record else "",
                stopped=w.stopped_at is not None,
                recorded_exit_code=record.exit_code if record else None,
                config_error=record.config_error if record else False,
            ))
        first = None
        if blamed is not None:
            first = next(e for e in exits if e.rank == blamed.launch.rank)
        return RunResult(exits=tuple(exits), first_failure=first, stop_signal=self._stop_signal,
                         unreaped=self._unreaped)


def _failure_key(worker: _Worker) -> tuple[bool, float, int] | None:
    """How ``worker`` ranks as the root cause (lower first: not a lost peer, then the time it
    failed, then its rank), or None when it did not fail on its own (see
    :meth:`Supervisor._root_cause`)."""
    code = worker.returncode
    if code in (None, 0, REQUEUE_EXIT_CODE):
        return None
    record = read_failure(worker.launch.error_file) if worker.launch.error_file else None
    if record is None:
        if code is not None and code < 0 and -code in worker.stop_signals:
            return None  # the teardown's signal ended it
        return (False, worker.ended_at or math.inf, worker.launch.rank)
    if worker.stopped_at is not None and record.time > worker.stopped_at:
        return None  # it failed because the teardown stopped it
    return (record.lost_peer, record.time, worker.launch.rank)


def _attempt_end(result: RunResult) -> str:
    """How an attempt that is restarted ended, for the restart's line."""
    if result.requeued:
        return f"stopped to be requeued (exit code {REQUEUE_EXIT_CODE})"
    first = result.first_failure
    cause = (f"rank {first.rank}: {first.describe()}"
             if first else f"exit code {exit_code_of(result.exit_code)}")
    return f"failed ({cause})"


def _sink_of(fd: int) -> tuple[int, int]:
    """What ``fd`` writes to (device and inode), so that two fds on one terminal are one sink."""
    try:
        info = os.fstat(fd)
    except OSError:
        return (-1, fd)
    return (info.st_dev, info.st_ino)


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
    """The command line of a worker: the bootstrap, then ``SCRIPT ARGS``, ``-m MODULE ARGS``,
    ``--exec PROGRAM ARGS`` (``--no-python``) or ``--call FILE`` (``Parallel``)."""
    return (python or sys.executable, "-m", "unirank.supervisor.worker.bootstrap", *target)


def attempt_launches(plan: Plan, argv: tuple[str, ...], environ: Mapping[str, str],
                     options: EngineOptions, attempt: int, attempt_dir: str,
                     store_fd: int | None, keep_logs: bool) -> list[WorkerLaunch]:
    """How to start each of this node's workers for attempt ``attempt``: its command line,
    environment base and wiring (error file in ``attempt_dir``, the store's listening
    ``store_fd`` for rank 0, the timeline), and where its output goes."""
    out = options.output
    launches = []
    for worker in plan.workers:
        # torchrun's layout: one folder per local rank, made before the worker starts, so that
        # torch's @record can write its error file there
        folder = os.path.join(attempt_dir, str(worker.local_rank))
        os.makedirs(folder, exist_ok=True)
        wiring = WorkerWiring(
            supervisor_pid=os.getpid(), restart_count=attempt, unbuffered=out.unbuffered,
            error_file=os.path.join(folder, "error.json"),
            store_fd=store_fd if worker.rank == 0 else None,
            timeline_file=(os.path.join(attempt_dir, "timeline.json")
                           if options.timeline and worker.rank == 0 else None),
        )
        files = out.log_files(worker.local_rank, folder) if keep_logs else (None, None)
        shown = out.shown(worker.local_rank)
        launches.append(WorkerLaunch(
            worker.rank, worker.local_rank, argv, plan, worker, environ, wiring,
            timeline=options.timeline,
            stdout_console=shown and not out.redirected(worker.local_rank, 1),
            stderr_console=shown and not out.redirected(worker.local_rank, 2),
            stdout_file=files[0], stderr_file=files[1],
            prefix=out.prefix(worker.rank, worker.local_rank, plan.role),
        ))
    return launches


def _log_root(plan: Plan, options: EngineOptions, err_fd: int) -> tuple[str, bool]:
    """The run's folder (``<log_dir>/<run_id>``) and whether to keep it afterwards."""
    out = options.output
    if out.log_dir:
        return os.path.join(out.log_dir, plan.run_id), True
    base = tempfile.mkdtemp(prefix="unirank-run-")
    if out.writes_files:
        os.write(err_fd, f"{options.prog}: log files in {base}\n".encode())
        return base, True
    return base, False


def _report_timeline(path: str, options: EngineOptions, err_fd: int) -> None:
    """Print the start-up timeline rank 0 gathered (where rank 0 ran), and write its JSON."""
    from unirank.supervisor.worker.timeline import format_table

    try:
        with open(path, encoding="utf-8") as fh:
            records = json.load(fh)
    except (OSError, ValueError):
        return  # rank 0 runs elsewhere, or did not finish: its node prints the table
    os.write(err_fd, format_table(records).encode())
    if options.timeline_json:
        with open(options.timeline_json, "w", encoding="utf-8") as fh:
            json.dump(records, fh, indent=1)


def _configure(server: ForkServer, plan: Plan, environ: Mapping[str, str],
               options: EngineOptions) -> None:
    """Give the fork server the environment this node's workers have in common."""
    wiring = WorkerWiring(supervisor_pid=os.getpid(), unbuffered=options.output.unbuffered)
    server.configure(server_environ([worker_environ(plan, w, environ, wiring)
                                     for w in plan.workers]))


def _cannot_serve(server: ForkServer, options: EngineOptions, err_fd: int) -> bool:
    """Wait until the fork server imported; True (having said why, and closed it) when it
    cannot serve."""
    why = server.wait_ready()
    if why is not None:
        os.write(err_fd, f"{options.prog}: {fallback_line(why)}\n".encode())
    return why is not None


def run_plan(
    plan: Plan,
    target: Sequence[str],
    *,
    environ: Mapping[str, str],
    options: EngineOptions | None = None,
    out_fd: int = 1,
    err_fd: int = 2,
    server: ForkServer | None = None,
) -> RunResult:
    """Open the store's port (where rank 0 runs, once its master address is known to be this
    host's: :func:`unirank.resolve.require_own`), start this node's workers and supervise
    them, restarting the group up to ``plan.max_restarts`` times after a failure (forked
    again from the same server).

    ``target`` is what follows the bootstrap on the worker's command line (see
    :func:`worker_command`); ``environ`` the base of every worker's environment (see
    :func:`~unirank.supervisor.workerenv.worker_environ`); ``server`` the node's fork server
    (:func:`~unirank.supervisor.fork.client.start_server`; None: every worker starts as its own
    interpreter), which this function configures and closes.
    """
    options = options or EngineOptions()
    # workers on a terminal print unbuffered, though through a pipe (see supervisor.output)
    options = replace(options, output=replace(options.output, console_tty=os.isatty(out_fd)))
    sock: socket.socket | None = None
    try:
        if plan.hosts_store:  # rank 0 serves here: the master address must be this host's
            require_own(plan.master_addr, source=plan.master_source or "MASTER_ADDR",
                        environ=environ)
            sock = open_store_socket(plan.master_port, host=plan.master_addr,
                                     option="MASTER_PORT")
            plan = plan.with_port(int(sock.getsockname()[1]))
        if server is not None:
            _configure(server, plan, environ, options)
            if _cannot_serve(server, options, err_fd):
                server = None
        return _run_attempts(plan, worker_command(target), environ, options, sock, server,
                             (out_fd, err_fd))
    finally:
        if sock is not None:
            sock.close()
        if server is not None:
            server.close()


def _run_attempts(plan: Plan, argv: tuple[str, ...], environ: Mapping[str, str],
                  options: EngineOptions, sock: socket.socket | None,
                  server: ForkServer | None, fds: tuple[int, int]) -> RunResult:
    """Run the workers, restarting them after a failure up to ``plan.max_restarts`` times."""
    out_fd, err_fd = fds
    root, keep = _log_root(plan, options, err_fd)
    earlier: list[RunResult] = []
    try:
        attempt = 0
        while True:
            attempt_dir = os.path.join(root, f"attempt_{attempt}")
            shutil.rmtree(attempt_dir, ignore_errors=True)
            launches = attempt_launches(plan, argv, environ, options, attempt, attempt_dir,
                                        sock.fileno() if sock else None, keep)
            result = Supervisor(
                launches, node_name=plan.node_name, grace_period=options.grace_period,
                signals=options.signals, out_fd=out_fd, err_fd=err_fd, prog=options.prog,
                server=server, slurm_kills=slurm_vars.in_job(environ),
            ).run()
            if (result.exit_code == 0 or result.stop_signal is not None
                    or attempt >= plan.max_restarts
                    or (result.requeued and slurm_vars.in_job(environ))):
                if options.timeline:
                    _report_timeline(os.path.join(attempt_dir, "timeline.json"), options,
                                     err_fd)
                return replace(result, attempts=tuple(earlier))
            earlier.append(result)
            os.write(err_fd, (
                f"{options.prog}: attempt {attempt} {_attempt_end(result)}; restarting the "
                f"workers ({attempt + 1} of {plan.max_restarts} restarts)\n").encode())
            attempt += 1
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
