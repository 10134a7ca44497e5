"""The process engine: starting, watching and stopping the workers of one node, one attempt.

Runs in the ``unirank run`` parent (never imports torch); :func:`~.attempts.run_plan` runs one
:class:`Supervisor` per attempt. One thread, no polling: the supervisor sleeps in ``select`` on
the workers' output pipes (read by :class:`~.streams.WorkerStreams`), their done pipes, the
fork server's socket and the signal wakeup fd, where SIGCHLD and the signals it forwards
arrive. Each worker runs in its own session (process group), as under torchrun, so that a
terminal's Ctrl-C reaches only the supervisor, which forwards it once, and so that stopping a
worker stops its children too.

The decisions are pure functions elsewhere; this loop carries them out:

* what a stop signal, a failed worker, a change of the world (the workers' console lines from
  then on go to the attempt's ``folded.log``: :meth:`.streams.WorkerStreams.fold`), a
  worker stuck in D state (:mod:`.dstate`'s thread says so), a second signal and the end of
  the grace period lead to: :mod:`.stoppolicy` (signals to forward, by default SIGINT, SIGTERM,
  SIGUSR1, SIGUSR2; the grace period; Slurm's SIGTERM; the hang report at a stop, which the
  node of rank 0 asks :mod:`.stopreport` for; where a node is gone, SIGKILL at once to the
  workers that wait in a collective, by their hang watcher's mark);
* which worker is the root cause, whose exit code is the run's: :mod:`.rootcause` (the one
  that failed first on its own, by the time it recorded; lost-peer records after the others);
* how to start a worker, reap it and signal it: :mod:`.spawn`; what is kept of each one and
  its end: :mod:`.workers`; how to start it: :class:`~.workerlaunch.WorkerLaunch`.

A worker that exits with :data:`~unirank.exitcodes.REQUEUE` (79) saved its
checkpoint and stopped to run again: no failure, no teardown. Why a worker died: a SIGKILL
that the supervisor did not send is checked against its memory cgroup's OOM-kill count, noted
at its start (:mod:`.deathcause`); a fatal signal's Python stack comes from its fault file.

Workers arm PR_SET_PDEATHSIG, so a supervisor killed by SIGKILL leaves no orphans; at its end
the supervisor kills whatever is left in the workers' groups. The store's host (rank 0) gets
the read end of a *linger pipe*, closed once every other worker closed its done pipe: the
host's bootstrap waits for that, so the store outlives every local rank's use of it.

Reads: no environment variable (the workers' environments come whole in each
:class:`WorkerLaunch`).
"""

from __future__ import annotations

import os
import selectors
import signal
import sys
import threading
import time
from collections.abc import Sequence

from unirank.contract import DEFAULT_GRACE_PERIOD
from unirank.runfolder import AttemptFolder
from unirank.signals import FORWARDED
from unirank.supervisor import stoppolicy
from unirank.supervisor.deathcause import oom_verdict
from unirank.supervisor.dstate import DStateWatch, read_state
from unirank.supervisor.fork.client import ForkServer
from unirank.supervisor.rdzv.messages import JOIN
from unirank.supervisor.rootcause import root_cause
from unirank.supervisor.spawn import exit_code, kill_all, send, start_worker
from unirank.supervisor.stoppolicy import Action, StopRules, StopState
from unirank.supervisor.stopreport import StopReport, StopReportSpec
from unirank.supervisor.streams import WorkerStreams
from unirank.supervisor.summary import RunResult, ended, signal_name
from unirank.supervisor.wakeup import signals_on_a_pipe
from unirank.supervisor.workerlaunch import WorkerLaunch, WorldWatch, worker_command
from unirank.supervisor.workers import StartedWorker, remove_if_empty, worker_exit

__all__ = ["Supervisor", "WorkerLaunch", "WorldWatch", "worker_command"]

#: the selector's marks for the fork server's socket, the world watch (:class:`WorldWatch`),
#: the stop's hang report (:class:`~.stopreport.StopReport`) and the D-state watch
_SERVER, _WATCH, _REPORT, _DSTATE = object(), object(), object(), object()
#: how long to wait for workers to vanish after SIGKILL before giving up on them
KILL_WAIT = 30.0


class Supervisor:
    """Runs one node's workers to the end (see the module docstring)."""

    def __init__(
        self,
        launches: Sequence[WorkerLaunch],
        *,
        node_name: str,
        grace_period: float = DEFAULT_GRACE_PERIOD,
        signals: Sequence[int] = FORWARDED,
        out_fd: int = 1,
        err_fd: int = 2,
        prog: str = "unirank run",
        kill_wait: float = KILL_WAIT,
        server: ForkServer | None = None,
        slurm_kills: bool = False,
        watch: WorldWatch | None = None,
        stop_report: StopReportSpec | None = None,
        dstate_timeout: float = 0.0,
        fold_file: str | None = None,
    ) -> None:
        self._launches = list(launches)
        #: seconds a worker may stay in D state (0: no watch), and the watch once started
        self._dstate_timeout = dstate_timeout
        self._dstate: DStateWatch | None = None
        #: where to ask for the hang report at the first stop signal (None: not here)
        self._report_spec = stop_report
        #: the report being made
        self._report: StopReport | None = None
        #: says when the world changed (the dynamic rendezvous): the workers are then stopped
        self._watch = watch
        #: the node's fork server (None: every worker starts as its own interpreter)
        self._server = server
        self._node = node_name
        self._rules = StopRules(grace_period=grace_period, kill_wait=kill_wait,
                                signals=tuple(int(s) for s in signals),
                                slurm_kills=slurm_kills)
        #: where the stop stands (:mod:`.stoppolicy` decides; this class carries it out)
        self._state = StopState()
        self._out_fd = out_fd
        self._err_fd = err_fd
        self._workers: list[StartedWorker] = []
        self._selector = selectors.DefaultSelector()
        #: the workers' output pipes, and the console and log files they go to
        self._output = WorkerStreams(self._selector, err_fd=err_fd, prog=prog,
                                     fold_file=fold_file)
        self._first_failure: StartedWorker | None = None
        self._unreaped: tuple[int, ...] = ()
        #: the write end of the store host's linger pipe, closed when the others have ended
        self._linger: int | None = None
        #: read ends of the other workers' done pipes
        self._done_pipes: dict[int, StartedWorker] = {}

    # -- public -------------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Start every worker, forward signals, stop the rest on the first failure, and return
        how each ended. Must run in the main thread (it handles signals)."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("the supervisor must run in the main thread (it handles signals)")
        try:
            with signals_on_a_pipe(self._rules.signals) as wake_r:
                self._selector.register(wake_r, selectors.EVENT_READ, None)
                if self._server is not None and not self._server.gone:
                    self._selector.register(self._server.fileno(), selectors.EVENT_READ,
                                            _SERVER)
                if self._watch is not None:
                    self._selector.register(self._watch.fileno(), selectors.EVENT_READ, _WATCH)
                self._start_all()
                self._watch_dstate()
                self._loop(wake_r)
                self._output.drain()
                folded = self._output.folded()
                if folded is not None:
                    self._output.say(folded)
                self._selector.unregister(wake_r)
        finally:
            if self._dstate is not None:
                self._dstate.close()
            self._cleanup()
            self._selector.close()
        return self._result()

    # -- starting -----------------------------------------------------------------------------

    def _start_all(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for launch in self._launches:
            started = start_worker(launch, self._output, self._server, out_fd=self._out_fd,
                                   err_fd=self._err_fd, say=self._output.say)
            self._workers.append(started.worker)
            if started.linger_write is not None:
                self._linger = started.linger_write
            if started.done_read is not None:
                self._done_pipes[started.done_read] = started.worker
                self._selector.register(started.done_read, selectors.EVENT_READ, started.worker)
        self._release_store_host()

    def _release_store_host(self) -> None:
        """Close the linger pipe once every worker but the store's host has ended."""
        if self._linger is not None and not any(
                w.alive and not w.program_done for w in self._workers
                if not w.launch.hosts_store):
            os.close(self._linger)
            self._linger = None

    def _watch_dstate(self) -> None:
        if self._dstate_timeout > 0:
            names = {w.pid: f"rank {w.launch.rank} (local rank {w.launch.local_rank})"
                     for w in self._workers}
            self._dstate = DStateWatch(self._dstate_timeout, names,
                                       lambda: [w.pid for w in self._alive()])
            self._selector.register(self._dstate.fileno(), selectors.EVENT_READ, _DSTATE)

    # -- the loop -----------------------------------------------------------------------------

    def _alive(self) -> list[StartedWorker]:
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
            tick = stoppolicy.on_tick(self._state, self._rules, now)
            if tick.give_up:
                self._unreaped = tuple(w.pid for w in self._alive())
                return
            if tick.kill or tick.end_waiting:
                self._apply(tick)
                continue
            for key, _events in self._selector.select(self._timeout(now)):
                if key.data is None:
                    self._on_wakeup(wake_r)
                elif key.data is _SERVER:
                    self._on_server()
                elif key.data is _WATCH:
                    self._on_world_change()
                elif key.data is _DSTATE:
                    self._on_dstate()
                elif key.data is _REPORT:
                    if self._report is not None and self._report.read():
                        self._end_report()
                elif isinstance(key.data, StartedWorker):
                    self._on_done(key.fd)
                else:
                    self._output.pump(key.data)
            self._output.flush_partial_lines(time.monotonic())

    def _timeout(self, now: float) -> float | None:
        """How long the loop may sleep: until the grace period ends or a partial line is due."""
        report = self._report.deadline if self._report is not None else None
        due = [d for d in (self._output.next_due(), self._state.deadline, report,
                           self._state.peer_deadline) if d is not None]
        return max(0.0, min(due) - now) if due else None

    def _apply(self, action: Action) -> None:
        """Carry out what the stop policy decided."""
        self._state = action.state
        if action.drop_report:
            self._close_report()
        if action.say:
            self._output.say(action.say)
        if action.forward is not None:
            for worker in self._alive():
                worker.stop_signals.add(action.forward)  # an end by it: stopped, not failed
                send(worker.pid, action.forward, group=False)
        if action.stop is not None:
            self._signal_all(action.stop)
        if action.kill:
            self._signal_all(signal.SIGKILL)
        if action.end_waiting:
            self._end_waiting()
        if action.ask_report:
            self._begin_report()

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
        kind = self._watch.kind()
        action = stoppolicy.on_world_change(self._state, change, alive=bool(self._alive()),
                                            rules=self._rules, now=time.monotonic(),
                                            node_gone=kind != JOIN, kind=kind)
        self._apply(action)
        if action.stop is not None:
            self._output.fold()  # what they print while they end is no news

    def _on_dstate(self) -> None:
        """Workers stayed in D state past the timeout: stop them all (no restart follows)."""
        assert self._dstate is not None
        self._selector.unregister(self._dstate.fileno())
        self._apply(stoppolicy.on_stuck(self._state, self._dstate.stuck() or "",
                                        rules=self._rules, now=time.monotonic()))

    def _on_wakeup(self, wake_r: int) -> None:
        try:
            data = os.read(wake_r, 512)
        except BlockingIOError:
            return
        for signum in data:  # SIGCHLD changes nothing: the loop reaps after every wakeup
            self._apply(stoppolicy.on_signal(self._state, signum, self._rules,
                                             time.monotonic(), self._report_wanted))

    def _report_wanted(self) -> bool:
        return self._report_spec is not None and self._report_spec.someone_waits()

    # -- the stop's hang report ---------------------------------------------------------------

    def _begin_report(self) -> None:
        """Ask for the hang report (once per run); the signal waits for it."""
        assert self._report_spec is not None and self._state.reporting is not None
        spec, self._report_spec = self._report_spec, None
        name = signal_name(self._state.reporting)
        try:
            self._report = StopReport(spec, name)
        except OSError:
            self._apply(stoppolicy.on_report_end(self._state, self._rules, time.monotonic()))
            return
        self._selector.register(self._report.fileno(), selectors.EVENT_READ, _REPORT)
        self._output.say(f"got {name}: looking for ranks that wait in a collective, for the hang "
                         f"report, before forwarding it (at most "
                         f"{self._report.deadline - time.monotonic():.0f} s; {name} again to "
                         "stop now)")

    def _close_report(self) -> tuple[str, bool]:
        """Stop waiting for the report: its text so far, and whether it found ranks that can
        never return from their collectives."""
        report, self._report = self._report, None
        if report is None:
            return "", False
        self._selector.unregister(report.fileno())
        report.close()
        return report.text(), report.cannot_return()

    def _end_report(self) -> None:
        """The report came (or its time is up): show it, then forward the waiting signal."""
        text, cannot_return = self._close_report()
        if text.strip():
            self._output.show(text)
        self._apply(stoppolicy.on_report_end(self._state, self._rules, time.monotonic(),
                                             cannot_return=cannot_return))

    # -- ends ---------------------------------------------------------------------------------

    def _reap(self) -> None:
        for worker in self._workers:
            if not worker.alive:
                continue
            code = exit_code(worker, self._server)
            if code is None:
                continue
            worker.returncode = code
            worker.ended_at = time.time()
            if code == -signal.SIGKILL and signal.SIGKILL not in worker.stop_signals:
                worker.oom = oom_verdict(worker.pid, worker.cgroup, since=worker.started - 1.0)
            if code < 0 and -code in worker.stop_signals:
                self._on_forwarded_end(worker, -code)
            elif stoppolicy.is_first_failure(self._state, code):
                self._first_failure = worker
                self._on_first_failure(worker)
        self._release_store_host()

    def _who(self, worker: StartedWorker) -> str:
        """The worker and how it ended, for the stop policy's line."""
        return (f"rank {worker.launch.rank} (local rank {worker.launch.local_rank}) on node "
                f"{self._node} {ended(worker.describe())}")

    def _on_first_failure(self, worker: StartedWorker) -> None:
        others = len(self._alive())
        record = worker.record() if others else None
        self._apply(stoppolicy.on_first_failure(
            self._state, others=others, config_error=record is not None and record.config_error,
            who=self._who(worker), rules=self._rules, now=time.monotonic()))

    def _on_forwarded_end(self, worker: StartedWorker, signum: int) -> None:
        self._apply(stoppolicy.on_forwarded_end(self._state, signum, others=len(self._alive()),
                                                who=self._who(worker), rules=self._rules,
                                                now=time.monotonic()))

    def _end_waiting(self) -> None:
        """A node is gone, or the ranks' collectives cannot return: SIGKILL now to each worker
        that waits in a collective (its hang watcher's mark,
        :class:`unirank.hang.waits.CollectiveMark`), saying why."""
        for worker in self._alive():
            folder, rank = worker.launch.wiring.attempt_dir, worker.launch.rank
            if folder is None or not os.path.exists(AttemptFolder(folder).collective_mark(rank)):
                continue
            self._output.say(f"rank {rank} (local rank {worker.launch.local_rank}) on node "
                             f"{self._node} waits in a collective {self._state.waiting_why}: "
                             "SIGKILL now, not after the grace period")
            worker.stop_signals.add(int(signal.SIGKILL))
            send(worker.pid, signal.SIGKILL, group=True)

    def _signal_all(self, signum: int) -> None:
        """Send a stop signal (or SIGKILL) to every live worker's process group, noting it;
        then SIGCONT to a worker that is stopped (SIGSTOP, Ctrl-Z: an evicted stuck rank), so
        that it takes the stop signal now, not SIGKILL at the grace period's end."""
        now = time.time()
        for worker in self._alive():
            if worker.stopped_at is None:
                worker.stopped_at = now
            worker.stop_signals.add(int(signum))
            send(worker.pid, signum, group=True)
            if signum != signal.SIGKILL and read_state(worker.pid) == "T":
                send(worker.pid, signal.SIGCONT, group=True)

    # -- the end ------------------------------------------------------------------------------

    def _cleanup(self) -> None:
        """Leave nothing behind: kill workers still running (an error got us here) and whatever
        their process groups still hold (rank 0's store), then close pipes and log files."""
        self._close_report()
        kill_all(self._workers, self._server, self._rules.kill_wait)
        self._output.close()
        if self._linger is not None:
            os.close(self._linger)
            self._linger = None
        for fd in self._done_pipes:
            self._selector.unregister(fd)
            os.close(fd)
        self._done_pipes.clear()

    def _result(self) -> RunResult:
        first = (None if self._first_failure is None
                 else self._workers.index(self._first_failure))
        blamed = root_cause([w.ending() for w in self._workers], first)
        exits = tuple(worker_exit(w, self._node, blamed=i == blamed)
                      for i, w in enumerate(self._workers))
        for worker in self._workers:
            remove_if_empty(worker.launch.fault_file)
        return RunResult(exits=exits, first_failure=None if blamed is None else exits[blamed],
                         stop_signal=self._state.stop_signal, unreaped=self._unreaped,
                         world_changed=self._state.world_changed,
                         world_change_kind=self._state.world_change_kind, stuck=self._state.stuck)
