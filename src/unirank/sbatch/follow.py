"""``unirank sbatch --follow``: wait for a job, stream its output files, end with its exit code.

The job's state comes from ``scontrol``/``sacct`` (:mod:`unirank.sbatch.commands`), polled with an
interval that grows from :data:`POLL_MIN_S` to :data:`POLL_MAX_S` and starts again from the
minimum whenever the output grew. The output files (``StdOut``/``StdErr`` as Slurm resolved them)
are streamed as they grow, across requeues: with ``--open-mode=append`` a requeued run appends
to the same file; a file that shrank (truncated by a run without append) is read again from its
start. Ctrl-C only sets a flag (:class:`Interrupt`); the loop then asks whether to cancel the
job or detach when stdin is a terminal, and detaches otherwise; a detach ends ``--follow`` with
:data:`unirank.exitcodes.INTERRUPTED` (130, as a shell reports a Ctrl-C), not the job's code, so
that ``unirank sbatch --follow ... && next`` does not go on while the job still runs.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import BinaryIO, Optional, TextIO

from unirank.exitcodes import INTERRUPTED
from unirank.sbatch.commands import REQUEUE_STATES, JobInfo, cancel, exit_status, job_info

__all__ = ["POLL_MAX_S", "POLL_MIN_S", "FileStream", "Interrupt", "failed_tasks", "follow"]

POLL_MIN_S = 0.25
POLL_MAX_S = 5.0
#: how many times in a row the job may be unknown to Slurm before --follow gives up
UNKNOWN_LIMIT = 5
#: polls a requeueable job may stay PREEMPTED/NODE_FAIL before that is taken as its end
SETTLE_POLLS = 20
_SRUN_ERROR = re.compile(r"srun: error: (?P<node>[^:\s]+): tasks? (?P<tasks>[0-9,\-]+): "
                         r"(?P<what>.+?)\s*$")
_KEEP_LINES = 200


@dataclass
class FileStream:
    """One output file, copied to ``sink`` as it grows; remembers where it stopped."""

    path: str
    sink: BinaryIO
    offset: int = 0
    tail: list[str] = field(default_factory=list)

    def pump(self) -> int:
        """Copy what was appended since the last call; the number of bytes copied."""
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return 0
        if size < self.offset:  # truncated by a new run: read it again from the start
            self.offset = 0
        if size == self.offset:
            return 0
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            data = handle.read(size - self.offset)
        self.offset += len(data)
        self.sink.write(data)
        self.sink.flush()
        self.tail = (self.tail + data.decode("utf-8", "replace").splitlines())[-_KEEP_LINES:]
        return len(data)


class Interrupt:
    """SIGINT while following: the handler only sets :attr:`pending`; a wake-up pipe makes the
    waiting loop return at once."""

    def __init__(self) -> None:
        self.pending = False
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._old_handler: object = None
        self._old_fd = -1

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        self.pending = True

    def __enter__(self) -> Interrupt:
        self._old_handler = signal.signal(signal.SIGINT, self._handle)
        self._old_fd = signal.set_wakeup_fd(self._write)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.set_wakeup_fd(self._old_fd)
        signal.signal(signal.SIGINT, self._old_handler)  # type: ignore[arg-type]
        os.close(self._read)
        os.close(self._write)

    def wait(self, seconds: float) -> bool:
        """Wait ``seconds``, or less when a signal arrives; True when one did."""
        ready, _, _ = select.select([self._read], [], [], seconds)
        if ready:
            with contextlib.suppress(BlockingIOError):
                os.read(self._read, 512)
        return bool(ready)


def failed_tasks(lines: list[str]) -> list[str]:
    """srun's ``srun: error: NODE: task N: WHAT`` lines as ``N (NODE): WHAT``."""
    found = []
    for line in lines:
        match = _SRUN_ERROR.search(line)
        if match:
            found.append(f"{match['tasks']} ({match['node']}): {match['what']}")
    return found


@dataclass
class _Follower:
    job_id: str
    note: Callable[[str], None]
    out: BinaryIO
    err: BinaryIO
    streams: dict[str, FileStream] = field(default_factory=dict)
    last: tuple[str, int] = ("", -1)
    settling: int = 0

    def ended(self, info: JobInfo) -> bool:
        """True when ``info`` is the job's end: done, or still preempted after the polls that
        Slurm gets to requeue it."""
        self.settling = self.settling + 1 if info.state in REQUEUE_STATES else 0
        return info.done or self.settling > SETTLE_POLLS

    def attach(self, info: JobInfo) -> None:
        for path, sink in ((info.stdout, self.out), (info.stderr, self.err)):
            if path and path not in self.streams:
                self.streams[path] = FileStream(path, sink)

    def pump(self) -> int:
        return sum(stream.pump() for stream in self.streams.values())

    def report(self, info: JobInfo) -> None:
        if (info.state, info.restarts) == self.last:
            return
        if info.restarts > max(self.last[1], 0):
            self.note(f"job {self.job_id} was requeued (restart {info.restarts})")
        where = f" on {info.nodes}" if info.state == "RUNNING" and info.nodes else ""
        why = f" ({info.reason})" if info.state == "PENDING" and info.reason not in ("", "None") \
            else ""
        self.note(f"job {self.job_id} {info.state}{where}{why}")
        self.last = (info.state, info.restarts)

    def tail(self) -> list[str]:
        return [line for stream in self.streams.values() for line in stream.tail]


def _ask(job_id: str, interactive: bool, prompt: Callable[[str], str]) -> str:
    """``cancel`` or ``detach``: asked on a terminal, ``detach`` otherwise (and on EOF)."""
    if not interactive:
        return "detach"
    try:
        answer = prompt(f"unirank sbatch: job {job_id} is still running: [c]ancel it or "
                        "[d]etach? [d] ")
    except EOFError:
        return "detach"
    return "cancel" if answer.strip().lower() in ("c", "cancel") else "detach"


def _detached(job_id: str, logs: list[str]) -> str:
    """The line a detach ends with: the job goes on, how to follow it again, how to stop it."""
    again = (f"tail -f {' '.join(logs)} follows its output" if logs
             else f"squeue -j {job_id} shows it")
    return f"detached; job {job_id} keeps running: {again}, scancel {job_id} stops it"


def _finish(follower: _Follower, info: JobInfo, ranks: str) -> int:
    follower.pump()
    code = exit_status(info)
    if code == 0:
        follower.note(f"job {follower.job_id} {info.state}, exit code 0")
        return 0
    failed = "; ".join(f"{ranks} {item}" for item in failed_tasks(follower.tail()))
    signal_text = f", signal {info.signal}" if info.signal else ""
    follower.note(f"job {follower.job_id} {info.state}, exit code {info.exit_code}"
                  f"{signal_text}" + (f": {failed}" if failed else ""))
    return code


def follow(job_id: str, *, ranks: str = "rank", interactive: Optional[bool] = None,
           prompt: Callable[[str], str] = input, out: Optional[BinaryIO] = None,
           err: Optional[BinaryIO] = None, notes: Optional[TextIO] = None) -> int:
    """Follow job ``job_id`` to its end; the exit code ``--follow`` ends with (130 after a
    Ctrl-C detached it from the job, which goes on).

    ``ranks`` names what srun's tasks are in the failure line (``rank`` with one task per rank).
    ``interactive`` defaults to whether stdin is a terminal. Reads: PATH (Slurm's commands).
    """
    sink = notes or sys.stderr
    follower = _Follower(job_id, lambda text: print(f"unirank sbatch: {text}", file=sink,
                                                    flush=True),
                         out or sys.stdout.buffer, err or sys.stderr.buffer)
    interactive = sys.stdin.isatty() if interactive is None else interactive
    interval, unknown = POLL_MIN_S, 0
    with Interrupt() as interrupt:
        while True:
            info = job_info(job_id)
            unknown = 0 if info is not None else unknown + 1
            if info is None and unknown >= UNKNOWN_LIMIT:
                follower.note(f"job {job_id} is unknown to scontrol and sacct; stopped following")
                return 1
            if info is not None:
                follower.attach(info)
                if follower.ended(info):
                    return _finish(follower, info, ranks)
                follower.report(info)
            grew = follower.pump()
            if interrupt.pending:
                interrupt.pending = False
                if _ask(job_id, interactive, prompt) == "detach":
                    follower.note(_detached(job_id, list(follower.streams)))
                    return INTERRUPTED
                follower.note(f"cancelling job {job_id}" if cancel(job_id)
                              else f"scancel {job_id} failed")
                interactive = False  # a second Ctrl-C detaches
            interval = POLL_MIN_S if grew else min(POLL_MAX_S, interval * 1.5)
            interrupt.wait(interval)
