"""Whether ``--max-restarts`` starts the workers again after an attempt, which attempts spend a
restart, and the restart's line, decided over plain results: milliseconds, where
tests/cli/test_run.py checks the same with whole runs (:mod:`unirank.supervisor.budget`, and
``_attempt_end`` of :mod:`unirank.supervisor.attempts`)."""

from __future__ import annotations

import signal
from dataclasses import replace

import pytest

from unirank.exitcodes import REQUEUE as REQUEUE_EXIT_CODE
from unirank.supervisor.attempts import _attempt_end
from unirank.supervisor.budget import is_last, restarting_words, spends_restart
from unirank.supervisor.plan import Plan, Worker
from unirank.supervisor.summary import RunResult, WorkerExit

#: inside a Slurm job (its batch script requeues a job that stopped to be requeued)
SLURM = {"SLURM_JOB_ID": "42"}


def _plan(max_restarts: int) -> Plan:
    return Plan(mode="spawn", workers=(Worker(0, 0), Worker(1, 1)), world_size=2,
                local_world_size=2, nnodes=1, node_rank=0, master_addr="127.0.0.1",
                master_port=29500, run_id="r", node_name="n1", max_restarts=max_restarts)


def _exit(rank: int, code: int, *, stopped: bool = False) -> WorkerExit:
    return WorkerExit(rank=rank, local_rank=rank, node="n1", returncode=code, stopped=stopped)


OK = RunResult(exits=(_exit(0, 0), _exit(1, 0)))
FAILED = RunResult(exits=(_exit(0, -int(signal.SIGTERM), stopped=True), _exit(1, 3)),
                   first_failure=_exit(1, 3))
REQUEUED = RunResult(exits=(_exit(0, REQUEUE_EXIT_CODE), _exit(1, REQUEUE_EXIT_CODE)))
STOPPED = RunResult(exits=(_exit(0, -int(signal.SIGINT)), _exit(1, 0)),
                    stop_signal=int(signal.SIGINT))
WORLD = RunResult(exits=(_exit(0, -int(signal.SIGTERM), stopped=True),
                         _exit(1, -int(signal.SIGTERM), stopped=True)),
                  world_changed="node n2 was lost")


@pytest.mark.parametrize(("result", "spent", "restarts", "environ", "last"), [
    (OK, 0, 3, {}, True),                 # success ends the run
    (FAILED, 0, 3, {}, False),            # a failure with restarts left: again
    (FAILED, 2, 3, {}, False),
    (FAILED, 3, 3, {}, True),             # none left
    (FAILED, 0, 0, {}, True),             # the default: no restart
    (STOPPED, 0, 3, {}, True),            # a stop signal ends the run whatever is left
    (REQUEUED, 0, 3, {}, False),          # stopped to be requeued, no Slurm: run again here
    (REQUEUED, 0, 3, SLURM, True),        # under Slurm: 79 goes to the batch script
    (WORLD, 0, 3, {}, False),             # the world changed: restart at the new world
    (WORLD, 3, 3, {}, True),              # a node lost spends a restart: none left
], ids=["ok", "failed", "failed-2-of-3", "failed-none-left", "no-restarts", "stop-signal",
        "requeued", "requeued-slurm", "world", "world-none-left"])
def test_whether_the_attempt_is_the_last(result: RunResult, spent: int, restarts: int,
                                         environ: dict[str, str], last: bool) -> None:
    assert is_last(result, spent, _plan(restarts).max_restarts, environ) is last


@pytest.mark.parametrize(("spent", "restarts"), [(0, 0), (3, 3), (5, 3)])
def test_nodes_joining_restart_at_any_budget(spent: int, restarts: int) -> None:
    """torchrun: "membership changes do not count as retries", also at --max-restarts 0."""
    assert not is_last(WORLD, spent, restarts, {}, joining=True)
    assert not spends_restart(WORLD, joining=True)
    assert not spends_restart(replace(WORLD, exits=REQUEUED.exits), joining=True)  # saved


def test_what_spends_a_restart() -> None:
    """A failure, a node lost (the survivors' collective fails under torchrun), a requeue
    outside Slurm spend one; a failure while nodes wait to join spends one too."""
    assert spends_restart(FAILED, joining=False) and spends_restart(FAILED, joining=True)
    assert spends_restart(WORLD, joining=False)
    assert spends_restart(REQUEUED, joining=False)
    assert is_last(FAILED, 3, 3, {}, joining=True)


def test_the_restart_line_says_what_was_spent() -> None:
    assert restarting_words(0, 3, spends=True) == "restarting the workers (1 of 3 restarts)"
    assert restarting_words(3, 3, spends=False) == (
        "restarting the workers for the nodes joining (no restart spent; 3 of 3 spent)")


def test_the_exit_codes_the_decisions_see() -> None:
    assert (OK.exit_code, FAILED.exit_code, REQUEUED.exit_code, WORLD.exit_code) == \
        (0, 3, REQUEUE_EXIT_CODE, 1)
    assert REQUEUED.requeued and not FAILED.requeued


@pytest.mark.parametrize(("result", "line"), [
    (FAILED, "failed (rank 1: exit code 3)"),
    (REQUEUED, f"stopped to be requeued (exit code {REQUEUE_EXIT_CODE})"),
    (WORLD, "stopped (node n2 was lost)"),
    (RunResult(exits=(_exit(0, 1),), unreaped=(123,)), "failed (exit code 1)"),
], ids=["failed", "requeued", "world", "unreaped"])
def test_the_restart_line_says_how_the_attempt_ended(result: RunResult, line: str) -> None:
    assert _attempt_end(result) == line
