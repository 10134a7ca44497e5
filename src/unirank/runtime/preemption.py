"""Stop, checkpoint, requeue, resume: what a training loop calls.

* :func:`stop_requested` asked at step boundaries: True on every rank at the same call once any
  rank got a stop signal (:func:`unirank.signals.stop_signals`: SIGUSR2 and SIGTERM) or, with
  ``time_margin``, once the job has less than that many seconds left. The ranks
  agree through one all_reduce MAX of one int (unirank's own, so gloo, nccl, Horovod and XLA
  work), every ``every``-th call; at world size 1 there is no collective.
* :func:`time_left`: seconds until the Slurm job's end, None outside Slurm or without a limit.
* :func:`exit_for_requeue`: after the checkpoint is saved, requeue the Slurm job (rank 0,
  ``scontrol requeue``; not when Slurm's own SIGTERM is ending or requeueing it) and end every
  rank with :data:`~unirank.exitcodes.REQUEUE`; past the cap on requeues, fail with
  one line.

The signal handler only sets a flag; the checkpoint is saved by the loop, never in a handler.

The public functions are where the training program's environment comes in: each takes
``environ`` (default: ``os.environ``, read once per call) and hands it down; nothing below reads
``os.environ`` itself. ``squeue`` and ``scontrol`` are found on that environment's PATH and run
through :func:`unirank.slurmcmd.run_slurm`.

Reads (each function says which): UNIRANK_STOP_SIGNALS, UNIRANK_MAX_REQUEUES, SLURM_JOB_ID /
SLURM_JOBID, SLURM_JOB_END_TIME, SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID, SLURM_RESTART_COUNT,
PATH.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from types import FrameType
from typing import Any, NoReturn

from unirank.exitcodes import REQUEUE as REQUEUE_EXIT_CODE
from unirank.exitcodes import TERMINATED
from unirank.launchers import slurm_vars as V
from unirank.requeue import (
    parse_time_left,
    requeue_refusal,
    requeue_target,
    slurm_run_state,
)
from unirank.runtime import collectives, state
from unirank.signals import stop_signals
from unirank.slurmcmd import run_slurm

__all__ = ["exit_for_requeue", "stop_requested", "time_left", "unwatch_stop_signals",
           "watch_stop_signals"]

class _Stop:
    """The flag a handler sets, the signals watched, and the agreement's call counter."""

    def __init__(self) -> None:
        self.flag = False
        self.signum: int | None = None
        self.watched: dict[int, Any] = {}
        self.calls = 0
        self.agreed = False
        self.end_time: float | None = None
        self.end_known = False


_STOP = _Stop()


def _handler(signum: int, frame: FrameType | None) -> None:
    """Set the flag; nothing else (no raise, no I/O: the loop acts at its next step)."""
    _STOP.flag = True
    _STOP.signum = signum


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    """``environ``, or the program's own environment when None."""
    return os.environ if environ is None else environ


def watch_stop_signals(signals: Iterable[int | signal.Signals] | None = None, *,
                       environ: Mapping[str, str] | None = None) -> tuple[int, ...]:
    """Install the flag-setting handler for ``signals`` (default: UNIRANK_STOP_SIGNALS of
    ``environ``, else SIGUSR2 and SIGTERM); the handlers they had are kept and put back by
    :func:`unwatch_stop_signals`. Called by the first :func:`stop_requested`; call it earlier
    when a signal may come before the first step. Only from the main thread; elsewhere it
    watches nothing. Returns the signals watched.

    Reads: UNIRANK_STOP_SIGNALS.
    """
    chosen = stop_signals(_environ(environ)) if signals is None else signals
    wanted = [int(s) for s in chosen]
    if threading.current_thread() is not threading.main_thread():
        return tuple(_STOP.watched)
    for signum in wanted:
        if signum not in _STOP.watched:
            _STOP.watched[signum] = signal.signal(signum, _handler)
    return tuple(_STOP.watched)


def unwatch_stop_signals() -> None:
    """Put back the handlers :func:`watch_stop_signals` replaced, and forget any request."""
    for signum, previous in _STOP.watched.items():
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
    _STOP.__init__()  # type: ignore[misc]


def _local_request(time_margin: float | None, environ: Mapping[str, str]) -> int:
    if not _STOP.watched:
        watch_stop_signals(environ=environ)
    if time_margin is not None and not _STOP.flag:
        left = time_left(environ=environ)
        if left is not None and left <= time_margin:
            _STOP.flag = True
    return int(_STOP.flag)


def stop_requested(every: int = 1, time_margin: float | None = None, *,
                   environ: Mapping[str, str] | None = None) -> bool:
    """True on every rank at the same call once any rank was asked to stop.

    Call it at the same step boundaries on every rank, with the same ``every`` (the ranks agree
    every ``every``-th call: one all_reduce MAX of one int; the calls between return what was
    last agreed). ``time_margin``: also stop once :func:`time_left` is at most that many
    seconds. Once True it stays True. At world size 1 it answers every call, no collective.
    ``environ``: the environment to read (default ``os.environ``).

    Reads: UNIRANK_STOP_SIGNALS (first call), and for ``time_margin`` what
    :func:`time_left` reads.
    """
    if every < 1:
        raise ValueError(f"every must be 1 or more, not {every}")
    local = _local_request(time_margin, _environ(environ))
    if _STOP.agreed:
        return True
    call, _STOP.calls = _STOP.calls, _STOP.calls + 1
    if not state.is_initialized() or state.get_world_size() == 1:
        _STOP.agreed = bool(local)
        return _STOP.agreed
    if call % every:
        return False
    _STOP.agreed = bool(collectives.all_reduce(local, op="MAX"))
    return _STOP.agreed


def time_left(*, environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds until the Slurm job's end (0 once past it); None outside Slurm or for a job
    without a time limit. SLURM_JOB_END_TIME where Slurm sets it, else ``squeue -o %L``,
    asked once and remembered. ``environ``: the environment to read (default ``os.environ``).

    Reads: SLURM_JOB_ID / SLURM_JOBID, SLURM_JOB_END_TIME, PATH (squeue).
    """
    if not _STOP.end_known:
        _STOP.end_time = _job_end_time(_environ(environ))
        _STOP.end_known = True
    if _STOP.end_time is None:
        return None
    return max(0.0, _STOP.end_time - time.time())


def _job_end_time(environ: Mapping[str, str]) -> float | None:
    job = (V.job_id(environ)[0] or "").strip()
    if not job:
        return None
    end = environ.get(V.JOB_END_TIME, "").strip()
    if end.isdigit() and int(end) > 0:
        return float(end)
    squeue = shutil.which("squeue", path=environ.get("PATH"))
    if squeue is None:
        return None
    answer = run_slurm([squeue, "-h", "-j", job, "-o", "%L"], environ)
    left = parse_time_left(answer.stdout) if answer.returncode == 0 else None
    return None if left is None else time.time() + left


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _requeue_slurm_job(target: str, environ: Mapping[str, str]) -> int:
    """Rank 0: requeue the job unless Slurm is ending or requeueing it already (its SIGTERM);
    the exit code every rank then ends with: 79, or 143 (SIGTERM's) for a job ending for good.
    Without scontrol on PATH, 79: the batch shell requeues (``unirank sbatch --requeue``).

    Reads: SLURM_RESTART_COUNT, PATH (scontrol).
    """
    code = REQUEUE_EXIT_CODE
    scontrol = shutil.which("scontrol", path=environ.get("PATH"))
    if scontrol is None:
        _say(f"unirank: scontrol not found: exiting with {code} so that the batch script "
             f"requeues job {target}")
        return code
    shown = run_slurm([scontrol, "show", "job", "-o", target], environ)
    run_state = slurm_run_state(shown.stdout, environ)
    if run_state == "requeued":
        _say(f"unirank: stopped to be requeued (exit code {code}); Slurm requeues job {target}")
        return code
    if run_state == "ending":
        _say(f"unirank: stopped after the checkpoint; Slurm is ending job {target} without a "
             "requeue (cancelled, or at its time limit): submit it again to resume")
        return TERMINATED
    _say(f"unirank: stopped to be requeued (exit code {code}); requeueing job {target}")
    answer = run_slurm([scontrol, "requeue", target], environ)
    if answer.returncode != 0:
        _say(f"unirank: scontrol requeue {target} failed: {answer.stderr.strip()}; exiting "
             f"with {code} for the batch script")
    return code


def exit_for_requeue(*, environ: Mapping[str, str] | None = None) -> NoReturn:
    """End this rank so that the run goes on later from its checkpoint (save it first).

    Every rank waits for the others (a barrier), then: under Slurm, past the cap on requeues
    (UNIRANK_MAX_REQUEUES, default 10, against SLURM_RESTART_COUNT) every rank exits 1 after
    one line; else rank 0 asks Slurm about the job (``scontrol show job``): one that Slurm
    requeues already (``scontrol requeue``, preemption) is left to it; one that Slurm is ending
    (scancel, the time limit) is not requeued and every rank exits 143 (SIGTERM's code); else
    rank 0 requeues it (``scontrol requeue``, an array task only itself). Every rank then exits
    with rank 0's code, :data:`~unirank.exitcodes.REQUEUE` (79) unless the job ends.
    Outside Slurm it exits 79 as well (``unirank run --max-restarts`` and torchrun restart the
    workers), except a lone process that no launcher started, which exits 0 ("run it again to
    resume"). ``environ``: the environment to read (default ``os.environ``).

    Reads: SLURM_JOB_ID / SLURM_JOBID, SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID, SLURM_RESTART_COUNT,
    UNIRANK_MAX_REQUEUES, PATH (scontrol), and what launcher detection reads.
    """
    if state.is_initialized() and state.get_world_size() > 1:
        collectives.barrier()
    rank = state.get_rank()
    environ = _environ(environ)
    refusal = requeue_refusal(environ)
    if refusal is not None:
        if rank == 0:
            _say(refusal)
        sys.exit(1)
    target = requeue_target(environ)
    if target is not None:
        code = _requeue_slurm_job(target, environ) if rank == 0 else 0
        if state.is_initialized() and state.get_world_size() > 1:
            code = int(collectives.all_reduce(code, op="MAX"))  # rank 0's, on every rank
        sys.exit(code)
    if state.dist_env().launcher == "local" and state.get_world_size() == 1:
        _say("unirank: stopped after the checkpoint; run the same command again to resume")
        sys.exit(0)
    sys.exit(REQUEUE_EXIT_CODE)
