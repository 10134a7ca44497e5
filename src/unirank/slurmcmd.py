"""The one runner of Slurm commands in unirank (``sbatch``, ``scontrol``, ``sacct``, ``scancel``,
``squeue``): :func:`run_slurm`, with its one timeout, :data:`COMMAND_TIMEOUT_S`; and the pure
readings of their answers (:func:`parse_scontrol`, :func:`parse_sacct`, :class:`JobInfo`). Used by
:mod:`unirank.sbatch.commands` and :mod:`unirank.runtime.preemption` (outside ``sbatch/``, so
that the runtime needs nothing of ``unirank sbatch``).

Reads: PATH (to find the commands), or the ``environ`` a caller passes.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

__all__ = ["COMMAND_TIMEOUT_S", "REQUEUE_STATES", "TERMINAL_STATES", "JobInfo", "parse_sacct",
           "parse_scontrol", "run_slurm"]

#: how long one Slurm command may take before unirank gives up on it
COMMAND_TIMEOUT_S = 60.0


def run_slurm(cmd: list[str], environ: Optional[Mapping[str, str]] = None,
              stdin: Optional[str] = None) -> subprocess.CompletedProcess[str]:
    """Run Slurm command ``cmd`` (text ``stdin`` on its standard input, else none) in
    ``environ`` (default: this process's), for at most :data:`COMMAND_TIMEOUT_S`.

    Never raises for the command: one that did not answer in time comes back with code 124,
    one that could not be started with 127, each with the reason as its stderr.
    """
    program = os.path.basename(cmd[0])
    try:
        return subprocess.run(cmd, input=stdin, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S, check=False,
                              env=dict(environ) if environ is not None else None,
                              stdin=None if stdin is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"{program} did not answer in "
                                           f"{COMMAND_TIMEOUT_S:g} s")
    except OSError as exc:
        return subprocess.CompletedProcess(cmd, 127, "", f"{program} could not run: {exc}")


#: job states after which the job will not run again by itself
TERMINAL_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "TIMEOUT",
})
#: states after which Slurm requeues a job that may be requeued (``Requeue=1``)
REQUEUE_STATES = frozenset({"NODE_FAIL", "PREEMPTED"})
_FIELD = re.compile(r"(\w+)=(\S*)")


@dataclass(frozen=True)
class JobInfo:
    """What Slurm says of a job: its state and the batch script's exit code and signal."""

    state: str
    exit_code: int = 0
    signal: int = 0
    restarts: int = 0
    reason: str = ""
    nodes: str = ""
    stdout: Optional[str] = None
    stderr: Optional[str] = None
    requeue: bool = False

    @property
    def done(self) -> bool:
        """True once the job ended for good (a preempted or node-failed job that may be
        requeued is not done yet)."""
        if self.requeue and self.state in REQUEUE_STATES:
            return False
        return self.state in TERMINAL_STATES


def _exit_pair(text: str) -> tuple[int, int]:
    code, _, sig = text.partition(":")
    try:
        return int(code or 0), int(sig or 0)
    except ValueError:
        return 1, 0


def parse_scontrol(text: str) -> Optional[JobInfo]:
    """``scontrol show job -o ID`` output as a JobInfo (its first record); None when empty."""
    first = next((line for line in text.splitlines() if "JobState=" in line), None)
    if first is None:
        return None
    fields = dict(_FIELD.findall(first))
    code, sig = _exit_pair(fields.get("ExitCode", "0:0"))
    return JobInfo(
        state=fields.get("JobState", "UNKNOWN"), exit_code=code, signal=sig,
        restarts=int(fields.get("Restarts", "0") or 0), reason=fields.get("Reason", ""),
        nodes=fields.get("NodeList", ""), stdout=fields.get("StdOut") or None,
        stderr=fields.get("StdErr") or None, requeue=fields.get("Requeue") == "1",
    )


def parse_sacct(text: str) -> Optional[JobInfo]:
    """``sacct -X -n -P -o State,ExitCode,NodeList -j ID`` output as a JobInfo, or None."""
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2 and parts[0]:
            code, sig = _exit_pair(parts[1])
            state = parts[0].split()[0]  # "CANCELLED by 0" -> CANCELLED
            return JobInfo(state=state, exit_code=code, signal=sig,
                           nodes=parts[2] if len(parts) > 2 else "")
    return None
