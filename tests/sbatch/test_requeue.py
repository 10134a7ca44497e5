"""The pure parts of stop -> checkpoint -> requeue (unirank.requeue) and how ``unirank run``
reports workers that stopped to be requeued (supervisor.summary)."""

from __future__ import annotations

import signal

import pytest

from unirank.errors import ConfigError
from unirank.exitcodes import REQUEUE as REQUEUE_EXIT_CODE
from unirank.requeue import (
    max_requeues,
    parse_time_left,
    requeue_refusal,
    requeue_target,
    slurm_run_state,
)
from unirank.signals import stop_signals
from unirank.supervisor.summary import RunResult, WorkerExit, format_summary


def test_stop_signals_default_per_launcher_and_configurable() -> None:
    assert stop_signals({}) == (signal.SIGUSR2, signal.SIGTERM)
    assert stop_signals({"RANK": "0", "WORLD_SIZE": "2"}) == (signal.SIGUSR2, signal.SIGTERM)
    assert stop_signals({"SLURM_JOB_ID": "7"}) == (signal.SIGUSR2, signal.SIGTERM)
    assert stop_signals({"UNIRANK_STOP_SIGNALS": "usr1, SIGTERM,USR1"}) == (
        signal.SIGUSR1, signal.SIGTERM)
    assert stop_signals({"UNIRANK_STOP_SIGNALS": "12", "SLURM_JOB_ID": "7"}) == (
        signal.Signals(12),)


@pytest.mark.parametrize(("shown", "restart_count", "run_state"), [
    ("JobId=5 JobState=RUNNING Restarts=0", None, "running"),
    ("JobId=5 JobState=COMPLETING Requeue=1 Restarts=1", None, "requeued"),  # scontrol requeue
    ("JobId=5 JobState=COMPLETING Requeue=1 Restarts=2", "1", "requeued"),
    ("JobId=5 JobState=COMPLETING Requeue=1 Restarts=1", "1", "ending"),  # scancel, run 2
    ("JobId=5 JobState=COMPLETING Restarts=0", None, "ending"),  # scancel
    ("JobId=5 JobState=TIMEOUT Restarts=0", None, "ending"),
    ("", None, "running"),  # no answer: as before, unirank requeues
])
def test_slurm_run_state_tells_a_requeue_from_a_cancel(
    shown: str, restart_count: str | None, run_state: str,
) -> None:
    environ = {"SLURM_JOB_ID": "5"}
    if restart_count is not None:
        environ["SLURM_RESTART_COUNT"] = restart_count
    assert slurm_run_state(shown, environ) == run_state


@pytest.mark.parametrize(("value", "message"), [
    ("USR3", "UNIRANK_STOP_SIGNALS='USR3': names no signal"),
    ("KILL", "UNIRANK_STOP_SIGNALS='KILL': SIGKILL cannot be caught"),
])
def test_stop_signals_refuses_what_it_cannot_watch(value: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        stop_signals({"UNIRANK_STOP_SIGNALS": value})
    assert str(caught.value).startswith(message), str(caught.value)


@pytest.mark.parametrize(("text", "seconds"), [
    ("5:07", 307.0), ("1:00:00", 3600.0), ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5.0),
    ("1-02", 86400 + 7200.0), ("1-02:03", 86400 + 7200 + 180.0), ("45\n", 45.0),
    ("UNLIMITED", None), ("NOT_SET", None), ("INVALID", None), ("", None), ("x-1:00", None),
])
def test_parse_time_left_reads_squeue_s_format(text: str, seconds: float | None) -> None:
    assert parse_time_left(text) == seconds


def test_requeue_target_is_the_job_or_the_array_task() -> None:
    assert requeue_target({}) is None
    assert requeue_target({"SLURM_JOB_ID": "42"}) == "42"
    assert requeue_target({"SLURM_JOB_ID": "43", "SLURM_ARRAY_JOB_ID": "40",
                           "SLURM_ARRAY_TASK_ID": "3"}) == "40_3"


def test_the_older_job_id_variable_names_the_same_job() -> None:
    """SLURM_JOBID alone is the job as SLURM_JOB_ID is, for the target and for the cap."""
    assert requeue_target({"SLURM_JOBID": "42"}) == requeue_target({"SLURM_JOB_ID": "42"})
    assert requeue_target({"SLURM_JOBID": "42"}) == "42"
    capped = {"SLURM_RESTART_COUNT": "10"}
    assert requeue_refusal({"SLURM_JOBID": "42", **capped}) == (
        requeue_refusal({"SLURM_JOB_ID": "42", **capped}))
    assert requeue_refusal({"SLURM_JOBID": "42", **capped}) is not None


def test_requeues_are_capped_by_the_restart_count() -> None:
    assert max_requeues({}) == 10
    assert max_requeues({"UNIRANK_MAX_REQUEUES": "2"}) == 2
    with pytest.raises(ConfigError, match="UNIRANK_MAX_REQUEUES='-1': is not a whole number"):
        max_requeues({"UNIRANK_MAX_REQUEUES": "-1"})
    job = {"SLURM_JOB_ID": "42", "UNIRANK_MAX_REQUEUES": "2"}
    assert requeue_refusal({}) is None
    assert requeue_refusal(job) is None
    assert requeue_refusal({**job, "SLURM_RESTART_COUNT": "1"}) is None
    assert requeue_refusal({**job, "SLURM_RESTART_COUNT": "2"}) == (
        "unirank: not requeueing job 42 again: it ran 3 times (SLURM_RESTART_COUNT=2, "
        "UNIRANK_MAX_REQUEUES=2); raise UNIRANK_MAX_REQUEUES if it needs more runs to finish")


def _exit(rank: int, code: int) -> WorkerExit:
    return WorkerExit(rank=rank, local_rank=rank, node="n1", returncode=code)


def test_workers_that_stop_for_requeue_are_no_failure() -> None:
    both = RunResult(exits=(_exit(0, REQUEUE_EXIT_CODE), _exit(1, REQUEUE_EXIT_CODE)))
    assert both.requeued and both.exit_code == REQUEUE_EXIT_CODE
    assert format_summary(both) == (
        "unirank run: stopped to be requeued (exit code 79): ranks 0-1 saved and stopped so "
        "that the run goes on later; not a failure\n")
    one = RunResult(exits=(_exit(0, 0), _exit(1, REQUEUE_EXIT_CODE)),
                    stop_signal=signal.SIGTERM)
    assert one.requeued and one.exit_code == REQUEUE_EXIT_CODE
    assert "FAILED" not in format_summary(one)


def test_a_failure_beside_a_requeue_stop_is_still_a_failure() -> None:
    failed = WorkerExit(rank=1, local_rank=1, node="n1", returncode=1,
                        stderr_tail=("Traceback (most recent call last):", "ValueError: x"))
    result = RunResult(exits=(_exit(0, REQUEUE_EXIT_CODE), failed), first_failure=failed)
    assert not result.requeued and result.exit_code == 1
    assert format_summary(result).startswith("unirank run: FAILED (exit code 1): rank 1")
    killed = RunResult(exits=(_exit(0, REQUEUE_EXIT_CODE), _exit(1, -9)))
    assert not killed.requeued
