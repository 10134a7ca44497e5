"""One started worker, as the engine keeps it (:class:`StartedWorker`: its process, how it
ended, how the teardown treated it, why it died), and its end as the summary and the choice
of the root cause see it (:meth:`StartedWorker.ending`, :func:`worker_exit`).

Reads: no environment variable (each worker's error and fault files are named in its
:class:`~.workerlaunch.WorkerLaunch`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

from unirank.errorfile import RecordedFailure, read_failure
from unirank.supervisor.deathcause import (
    FAULT_SIGNALS,
    MemoryCgroup,
    OomVerdict,
    fault_stack,
    read_fault_file,
)
from unirank.supervisor.rootcause import Ending
from unirank.supervisor.summary import OutputTail, WorkerExit, describe_end
from unirank.supervisor.workerlaunch import WorkerLaunch

__all__ = ["StartedWorker", "remove_if_empty", "worker_exit"]


class StartedWorker:
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
        #: the signals the teardown sent it (SIGTERM, SIGKILL), and those forwarded to it
        #: (SIGUSR1...): an end by one of them is no failure of its own
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

    @property
    def peak_bytes(self) -> int | None:
        return None if self.peak_kib is None else self.peak_kib * 1024

    def record(self) -> RecordedFailure | None:
        """What its error file says, once it failed (None: nothing, or it did not fail)."""
        if not self.launch.error_file or self.returncode in (None, 0):
            return None
        return read_failure(self.launch.error_file)

    def describe(self) -> str:
        """How it ended (it did), with why it died where known."""
        return describe_end(self.returncode or 0, self.oom, self.peak_bytes)

    def ending(self) -> Ending:
        """Its end, for :func:`~.rootcause.root_cause`."""
        return Ending(rank=self.launch.rank, returncode=self.returncode, ended_at=self.ended_at,
                      stopped_at=self.stopped_at, stop_signals=frozenset(self.stop_signals),
                      record=self.record())


def _fault_stack(worker: StartedWorker) -> tuple[str, ...]:
    """The Python stack of ``worker``'s fatal signal, if one ended it: from its fault file, else
    from its stderr (where the program's own faulthandler writes)."""
    code = worker.returncode
    if code is None or -code not in FAULT_SIGNALS:
        return ()
    return tuple(read_fault_file(worker.launch.fault_file)
                 or fault_stack("\n".join(worker.tail.lines())))


def remove_if_empty(path: str | None) -> None:
    """Remove a worker's fault file that no fault wrote to (it opened it at its start)."""
    with contextlib.suppress(OSError):
        if path and os.path.getsize(path) == 0:
            os.unlink(path)


def worker_exit(worker: StartedWorker, node: str, *, blamed: bool) -> WorkerExit:
    """How ``worker`` ended, for the summary (``blamed``: it is the root cause, whose stderr
    tail is shown)."""
    record = worker.record()
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
        peak_memory=worker.peak_bytes,
        oom=worker.oom,
        fault_stack=_fault_stack(worker) if blamed else (),
        stderr_file=None if worker.launch.stderr_console else worker.launch.stderr_file,
    )
