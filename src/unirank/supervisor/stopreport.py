"""The hang report at a stop signal, from the parent's side (no torch).

On its first SIGINT or SIGTERM while the workers run, the supervisor of the node that runs
rank 0 (with the hang detector on, and not under Slurm, whose SIGTERM reaches the workers
directly), when rank 0's detector keeps the attempt's waiting mark
(:attr:`unirank.runfolder.AttemptFolder.waiting_mark`; some
rank waited an interval or more at its last look; else the signal is forwarded at once),
starts :mod:`unirank.hang.onstop` as a short helper process
(:func:`~unirank.supervisor.helper.start_helper`: the run's environment, a session of its own,
so that a terminal's second Ctrl-C reaches only the supervisor), reads the report from its stdout,
and forwards the signal when the child has ended or :meth:`StopReport.deadline` has passed
(:data:`START_ALLOWANCE` for the interpreter and torch's import, and the stacks' wait); a
second stop signal gives the report up and stops at once.

Reads no environment variable.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from unirank.supervisor.helper import start_helper

__all__ = ["START_ALLOWANCE", "StopReport", "StopReportSpec"]

#: seconds for the child to start, import torch and reach the store, besides the stacks' wait
START_ALLOWANCE = 8.0


@dataclass(frozen=True)
class StopReportSpec:
    """Where the job's store is, its world size, the watchers' interval, the detector's
    waiting mark (:attr:`unirank.runfolder.AttemptFolder.waiting_mark`), and the run's
    environment (the child's)."""

    addr: str
    port: int
    world_size: int
    interval: float
    waiting_mark: str
    environ: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def someone_waits(self) -> bool:
        """Whether the detector saw, at its last look, a rank that has waited in a collective
        for an interval or more: only then is a report asked for (a plain Ctrl-C of ranks that
        compute is forwarded at once, without starting the report's child)."""
        return os.path.exists(self.waiting_mark)


class StopReport:
    """One report being made (see the module docstring)."""

    def __init__(self, spec: StopReportSpec, signame: str) -> None:
        from unirank.hang.timings import STOP_ANSWER

        args = [spec.addr, str(spec.port), str(spec.world_size), f"{spec.interval:g}", signame]
        self._proc = start_helper("unirank.hang.onstop", args, spec.environ,
                                  stdout=subprocess.PIPE)
        assert self._proc.stdout is not None
        self._fd = self._proc.stdout.fileno()
        os.set_blocking(self._fd, False)
        self._chunks: list[bytes] = []
        #: when (``time.monotonic()``) the report is given up
        self.deadline = time.monotonic() + START_ALLOWANCE + STOP_ANSWER.of(spec.interval)

    def fileno(self) -> int:
        """The child's stdout."""
        return self._fd

    def read(self) -> bool:
        """Read what the child wrote; True once its stdout ended."""
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        self._chunks.append(data)
        return not data

    def text(self) -> str:
        """The report (empty: no hang, or none came)."""
        return b"".join(self._chunks).decode(errors="replace")

    def cannot_return(self) -> bool:
        """Whether the report (once :meth:`close` reaped its child) found ranks that wait in
        collectives none of them can ever return from."""
        from unirank.hang.onstop import CANNOT_RETURN

        return self._proc.returncode == CANNOT_RETURN

    def close(self) -> None:
        """End the child (if it still runs) and reap it."""
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)
        if self._proc.stdout is not None:
            self._proc.stdout.close()
