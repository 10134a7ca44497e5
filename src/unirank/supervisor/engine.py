"""The process engine: starting, watching and stopping the workers of one node, one attempt.

Runs in the ``unirank run`` parent (never imports torch); :func:`~.attempts.run_plan` runs one
:class:`Supervisor` per attempt. One thread, no polling: the supervisor sleeps in ``select`` on
the workers' output pipes (read by :class:`~.streams.WorkerStreams`), their done pipes, the
fork server's socket and the signal wakeup fd, where SIGCHLD and the signals it forwards
arrive. Each worker runs in its own session (process group), as under torchrun, so that a
terminal's Ctrl-C reaches only the supervisor, which forwards it once, and so that stopping a
worker stops its children too.

* When a worker fails (non-zero exit or death by a signal), the others get SIGTERM, then SIGKILL
  after the grace period. The root cause is the worker that failed first on its own, whatever
  order the exits are seen in (:func:`_root_cause`): its failure's time is the one
  it recorded (its ``TORCHELASTIC_ERROR_FILE``, written the moment its program raised or
  exited), else when its end was seen; a failure recorded as a lost peer (gloo's "Connection
  closed by peer"...) counts only when no rank failed on its own account, and a worker stopped
  by this teardown (ended by the signal it was sent, or recorded after it) never does. The
  exit code is the root cause's.
* The signals to forward (default SIGINT, SIGTERM, SIGUSR1, SIGUSR2) go to every worker; SIGINT
  and SIGTERM then start the same grace period (a second one kills at once). Under Slurm
  (``slurm_kills``) SIGTERM starts none and a second one is only forwarded: Slurm sends it to
  every process of the step and SIGKILL KillWait seconds later, which is the workers' time to
  save a checkpoint.
* The node that runs rank 0, with the hang detector on (``stop_report``), asks for the hang
  report before it forwards its first SIGINT or SIGTERM (not Slurm's): a short child process
  (:mod:`.stopreport`) prints it when some rank waits in a collective that another has not
  entered; the signal is forwarded when it has ended, or after its deadline; a second stop
  signal kills at once.
* A worker that exits with :data:`~unirank.exitcodes.REQUEUE` (79) saved its
  checkpoint and stopped to run again: no failure, no teardown. When every worker ended with 0
  or 79 the run's exit code is 79 (one line, no failure summary).
* Why a worker died (:mod:`.deathcause`): the engine notes each worker's memory cgroup and its
  OOM-kill count when it starts, and its peak memory (``ru_maxrss``) when it is reaped (by
  ``wait4`` here, or by the fork server, which sends it on); a SIGKILL that the supervisor did
  not send is named the kernel's OOM killer's when the count rose (or, without a count, when
  the kernel log says so), and a death by SIGSEGV, SIGBUS, SIGABRT, SIGFPE or SIGILL shows the
  Python stack the worker's faulthandler wrote (:mod:`.worker.faults`).
* Workers arm PR_SET_PDEATHSIG in their bootstrap, so a supervisor killed by SIGKILL leaves no
  orphans; when the supervisor ends it kills whatever is left in the workers' groups.
* The worker that hosts the rendezvous store (rank 0) gets the read end of a *linger pipe*; the
  supervisor closes it once every other worker has ended, and the host's bootstrap waits for
  that before it ends, so the store outlives every local rank's use of it.

Reads: no environment variable (the workers' environments come whole in each
:class:`WorkerLaunch`).
"""

from __future__ import annotations

import contextlib
import math
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol, Union

from unirank.contract import DEFAULT_GRACE_PERIOD
from unirank.errorfile import read_failure
from unirank.exitcodes import REQUEUE as REQUEUE_EXIT_CODE
from unirank.signals import FORWARDED as DEFAULT_SIGNALS
from unirank.signals import STOP_SIGNALS
from unirank.supervisor.deathcause import (
    FAULT_SIGNALS,
    MemoryCgroup,
    OomVerdict,
    fault_stack,
    memory_cgroup,
    oom_verdict,
    read_fault_file,
)
from unirank.supervisor.fork.client import ForkServer, fallback_line
from unirank.supervisor.output import LineCopy
from unirank.supervisor.plan import Plan, Worker
from unirank.supervisor.stopreport import StopReport, StopReportSpec
from unirank.supervisor.streams import WorkerStreams
from unirank.supervisor.summary import (
    OutputTail,
    RunResult,
    WorkerExit,
    describe_end,
    signal_name,
)
from unirank.supervisor.workerenv import WorkerWiring, worker_environ

if TYPE_CHECKING:
    from collections.abc import Callable

    _Handler = Union[Callable[[int, Union[FrameType, None]], Any], int, signal.Handlers, None]

__all__ = ["DEFAULT_SIGNALS", "Supervisor", "WorkerLaunch", "WorldWatch", "worker_command"]

#: the selector's mark for the fork server's socket
_SERVER = object()
#: the selector's mark for the world watch (:class:`WorldWatch`)
_WATCH = object()
#: the selector's mark for the stop's hang report (:class:`~.stopreport.StopReport`)
_REPORT = object()
#: how long to wait for workers to vanish after SIGKILL before giving up on them
KILL_WAIT = 30.0


class WorldWatch(Protocol):
    """What tells the engine that the world changed while the workers run (the dynamic
    rendezvous's helper: a node lost, or one waiting to join)."""

    def fileno(self) -> int:
        """A descriptor that becomes readable when there may be news."""

    def world_change(self) -> str | None:
        """The news, read without blocking: one line saying how the world changed, or None
        (nothing yet)."""


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
    #: ``--duplicate-stdout-filters`` / ``--duplicate-stderr-filters``: where lines are copied
    stdout_copy: LineCopy | None = None
    stderr_copy: LineCopy | None = None

    @property
    def target(self) -> tuple[str, ...]:
        """What follows the bootstrap on the command line (see :func:`worker_command`)."""
        return self.argv[len(worker_command(())):]

    @property
    def error_file(self) -> str | None:
        """Where the worker records its failure."""
        return self.wiring.error_file

    @property
    def fault_file(self) -> str | None:
        """Where the worker's faulthandler writes a fatal signal's stack."""
        return self.wiring.fault_file

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


class _Worker:
    """One started worker: its process, how it ended, and how the teardown treated it."""

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
        #: when it was started (``time.monotonic()``: the kernel log's clock)
        self.started = time.monotonic()
        #: its memory cgroup and OOM-kill count at its start (None: not known)
        self.cgroup: MemoryCgroup | None = None
        #: its peak resident memory in KiB, once reaped (None: not known)
        self.peak_kib: int | None = None
        #: after a SIGKILL nobody here sent: whether the OOM killer sent it (None: unknown)
        self.oom: OomVerdict | None = None

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
        watch: WorldWatch | None = None,
        stop_report: StopReportSpec | None = None,
    ) -> None:
        self._launches = list(launches)
        #: where to ask for the hang report at the first stop signal (None: not here)
        self._report_spec = stop_report
        #: the report being made, and the stop signal forwarded once it is done
        self._report: StopReport | None = None
        self._report_signal = 0
        #: says when the world changed (the dynamic rendezvous): the workers are then stopped
        self._watch = watch
        self._world_changed: str | None = None
        #: the node's fork server (None: every worker starts as its own interpreter)
        self._server = server
        self._node = node_name
        self._grace = grace_period
        self._signals = tuple(int(s) for s in signals)
        self._out_fd = out_fd
        self._err_fd = err_fd
        self._kill_wait = kill_wait
        #: under Slurm, whose SIGTERM comes with a SIGKILL KillWait seconds later
        self._slurm_kills = slurm_kills
        self._workers: list[_Worker] = []
        self._selector = selectors.DefaultSelector()
        #: the workers' output pipes, and the console and log files they go to
        self._output = WorkerStreams(self._selector, err_fd=err_fd, prog=prog)
        self._first_failure: _Worker | None = None
        self._stop_signal: int | None = None
        self._deadline: float | None = None
        self._killing = False
        self._unreaped: tuple[int, ...] = ()
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
            if self._watch is not None:
                self._selector.register(self._watch.fileno(), selectors.EVENT_READ, _WATCH)
            self._start_all()
            self._loop(wake_r)
            self._output.drain()
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

    def _start(self, launch: WorkerLaunch) -> None:
        """Start one worker: its stdout and stderr through pipes to :attr:`_output`, the read
        end of the linger pipe (the store's host) or the write end of a done pipe (the
        others)."""
        out_targets = self._output.targets(self._out_fd if launch.stdout_console else None,
                                           launch.stdout_file)
        err_targets = self._output.targets(self._err_fd if launch.stderr_console else None,
                                           launch.stderr_file)
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
        worker.cgroup = memory_cgroup(pid)
        self._workers.append(worker)
        if done_read is not None:
            os.set_blocking(done_read, False)
            self._done_pipes[done_read] = worker
            self._selector.register(done_read, selectors.EVENT_READ, worker)
        # stderr's bytes are kept too: its tail goes into the failure summary
        self._output.add(err_read, 2 * launch.local_rank + 1, err_targets, launch.prefix,
                         worker.tail, launch.stderr_copy)
        self._output.add(out_read, 2 * launch.local_rank, out_targets, launch.prefix, None,
                         launch.stdout_copy)

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
                self._output.say(fallback_line(why))
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
            if self._report is not None and now >= self._report.deadline:
                self._end_report()
                continue
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
                elif key.data is _WATCH:
                    self._on_world_change()
                elif key.data is _REPORT:
                    if self._report is not None and self._report.read():
                        self._end_report()
                elif isinstance(key.data, _Worker):
                    self._on_done(key.fd)
                else:
                    self._output.pump(key.data)
            self._output.flush_partial_lines(time.monotonic())

    def _timeout(self, now: float) -> float | None:
        """How long the loop may sleep: until the grace period ends or a partial line is due."""
        report = self._report.deadline if self._report is not None else None
        due = [d for d in (self._output.next_due(), self._deadline, report) if d is not None]
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
                self._output.say("the fork server ended; the workers forked from it were killed")

    def _on_world_change(self) -> None:
        """The watch has news: stop the workers when it says the world changed (unless they
        are being stopped already)."""
        assert self._watch is not None
        change = self._watch.world_change()
        if change is None:
            return
        self._selector.unregister(self._watch.fileno())
        if self._first_failure is None and self._stop_signal is None and self._alive():
            self._world_changed = change
            self._output.say(f"{change}; stopping the workers: SIGTERM now, SIGKILL after "
                             f"{self._grace:g} s")
            self._signal_all(signal.SIGTERM)

    def _on_wakeup(self, wake_r: int) -> None:
        try:
            data = os.read(wake_r, 512)
        except BlockingIOError:
            return
        for signum in data:
            if signum in STOP_SIGNALS and signum in self._signals:
                self._on_stop_signal(signum)
            elif signum in self._signals:
                for worker in self._alive():
                    _send(worker.pid, signum, group=False)
            # SIGCHLD: the loop reaps after every wakeup

    def _on_stop_signal(self, signum: int) -> None:
        # Slurm sends SIGTERM to every process of the step (srun passes on its own too) and
        # SIGKILL after KillWait: the workers get that long to save, no deadline of ours
        slurms = self._slurm_kills and signum == signal.SIGTERM
        if self._report is not None:  # a second one while the report is made: stop now
            self._close_report()
            self._stop_signal = self._report_signal
            self._kill_all()
            return
        if self._stop_signal is None and self._first_failure is None:
            if not slurms and self._report_spec is not None and \
                    self._report_spec.someone_waits():
                self._begin_report(signum)
                return
            self._stop_signal = signum
            if not slurms:
                self._output.say(
                    f"got {signal_name(signum)}: forwarded to the workers; SIGKILL in "
                    f"{self._grace:g} s ({signal_name(signum)} again to kill now)"
                )
            self._signal_all(signum, deadline=not slurms)
        elif slurms:
            self._signal_all(signum, deadline=False)
        else:
            self._kill_all()

    def _begin_report(self, signum: int) -> None:
        """Ask for the hang report (once per run); the signal waits for it."""
        assert self._report_spec is not None
        spec, self._report_spec = self._report_spec, None
        try:
            self._report = StopReport(spec, signal_name(signum))
        except OSError:
            self._on_stop_signal(signum)
            return
        self._report_signal = signum
        self._selector.register(self._report.fileno(), selectors.EVENT_READ, _REPORT)
        name = signal_name(signum)
        self._output.say(f"got {name}: looking for ranks that wait in a collective, for the hang "
                         f"report, before forwarding it (at most "
                         f"{self._report.deadline - time.monotonic():.0f} s; {name} again to "
                         "stop now)")

    def _close_report(self) -> str:
        """Stop waiting for the report: its text so far."""
        report, self._report = self._report, None
        if report is None:
            return ""
        self._selector.unregister(report.fileno())
        report.close()
        return report.text()

    def _end_report(self) -> None:
        """The report came (or its time is up): show it, then forward the waiting signal."""
        text = self._close_report()
        if text.strip():
            self._output.show(text)
        self._on_stop_signal(self._report_signal)

    def _exit_code(self, worker: _Worker) -> int | None:
        """How ``worker`` ended, or None while it runs."""
        if worker.proc is None:
            assert self._server is not None
            code = self._server.exit_code(worker.pid)
            worker.peak_kib = self._server.peak_memory(worker.pid)
            if code is None and self._server.gone:
                code = -int(signal.SIGKILL)  # its parent-death signal
            return code
        try:
            pid, status, usage = os.wait4(worker.pid, os.WNOHANG)
        except ChildProcessError:  # pragma: no cover - reaped elsewhere
            pid, status, usage = worker.pid, 255 << 8, None
        if pid == 0:
            return None
        worker.peak_kib = usage.ru_maxrss if usage is not None else None
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
            if code == -signal.SIGKILL and signal.SIGKILL not in worker.stop_signals:
                worker.oom = oom_verdict(worker.pid, worker.cgroup, since=worker.started - 1.0)
            if (code not in (0, REQUEUE_EXIT_CODE) and self._first_failure is None
                    and self._stop_signal is None and self._world_changed is None):
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
        self._output.say(
            f"rank {worker.launch.rank} (local rank {worker.launch.local_rank}) on node "
            f"{self._node} ended with {_describe(worker)}; stopping "
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

    # -- the end ------------------------------------------------------------------------------

    def _cleanup(self) -> None:
        """Leave nothing behind: kill workers still running (an error got us here) and whatever
        their process groups still hold (rank 0's store), then close pipes and log files."""
        self._close_report()
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
        self._output.close()
        if self._linger is not None:
            os.close(self._linger)
            self._linger = None
        for fd in self._done_pipes:
            self._selector.unregister(fd)
            os.close(fd)
        self._done_pipes.clear()

    def _result(self) -> RunResult:
        blamed = _root_cause(self._workers, self._first_failure)
        exits = tuple(_worker_exit(w, self._node, blamed=w is blamed) for w in self._workers)
        for worker in self._workers:
            _remove_if_empty(worker.launch.fault_file)
        first = None
        if blamed is not None:
            first = next(e for e in exits if e.rank == blamed.launch.rank)
        return RunResult(exits=exits, first_failure=first, stop_signal=self._stop_signal,
                         unreaped=self._unreaped, world_changed=self._world_changed)


def _root_cause(workers: Sequence[_Worker], first_failure: _Worker | None) -> _Worker | None:
    """The root cause of a failed run (``first_failure``: the first worker seen to fail; None:
    no worker failed).

    Candidates are the failed workers that failed on their own: a worker that recorded its
    error (see :mod:`unirank.errorfile`) before this supervisor signalled it, or one without
    a record that did not end by a signal the teardown sent it (a worker killed by, say,
    SIGSEGV may be seen to end after the teardown signalled it). The earliest failure wins:
    a record's time, else when the end was seen; failures recorded as a lost peer come
    after all others (they are the consequence of another rank's failure, and may be
    recorded or seen first). Without candidates, the first worker seen to fail.
    """
    if first_failure is None:
        return None
    ranked = [(key, worker) for worker in workers if (key := _failure_key(worker)) is not None]
    if not ranked:
        return first_failure
    return min(ranked, key=lambda item: item[0])[1]


def _describe(worker: _Worker) -> str:
    """How ``worker`` ended (it did), with why it died where known."""
    return describe_end(worker.returncode or 0, worker.oom, _peak_bytes(worker))


def _peak_bytes(worker: _Worker) -> int | None:
    return None if worker.peak_kib is None else worker.peak_kib * 1024


def _fault_stack(worker: _Worker) -> tuple[str, ...]:
    """The Python stack of ``worker``'s fatal signal, if one ended it: from its fault file, else
    from its stderr (where the program's own faulthandler writes)."""
    code = worker.returncode
    if code is None or -code not in FAULT_SIGNALS:
        return ()
    return tuple(read_fault_file(worker.launch.fault_file)
                 or fault_stack("\n".join(worker.tail.lines())))


def _remove_if_empty(path: str | None) -> None:
    """Remove a worker's fault file that no fault wrote to (it opened it at its start)."""
    with contextlib.suppress(OSError):
        if path and os.path.getsize(path) == 0:
            os.unlink(path)


def _worker_exit(worker: _Worker, node: str, *, blamed: bool) -> WorkerExit:
    """How ``worker`` ended, for the summary (``blamed``: it is the root cause, whose stderr
    tail is shown)."""
    record = read_failure(worker.launch.error_file) if (
        worker.launch.error_file and worker.returncode not in (None, 0)) else None
    return WorkerExit(
        rank=worker.launch.rank,
        local_rank=worker.launch.local_rank,
        node=node,
        returncode=(worker.returncode if worker.returncode is not None
                    else -int(signal.SIGKILL)),
        stderr_tail=tuple(worker.tail.lines()) if blamed else (),
        error=record.message if record else "",
        stopped=worker.stopped_at is not None,
        recorded_exit_code=record.exit_code if record else None,
        config_error=record.config_error if record else False,
        lost_peer=record.lost_peer if record else False,
        peak_memory=_peak_bytes(worker),
        oom=worker.oom,
        fault_stack=_fault_stack(worker) if blamed else (),
    )


def _failure_key(worker: _Worker) -> tuple[bool, float, int] | None:
    """How ``worker`` ranks as the root cause (lower first: not a lost peer, then the time it
    failed, then its rank), or None when it did not fail on its own (see :func:`_root_cause`)."""
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
