"""torchrun 2.13's D-state timeout (unirank.supervisor.dstate): the pure rules (the variable, the
state field, the dwell clock, the stop policy's answer, no restart, the exit code) and a real
worker held in uninterruptible sleep ended by ``unirank run``.

The real D state comes from ``vfork``: the parent of a vfork'ed child that has not exec'ed
waits in the kernel in a killable uninterruptible sleep, shown as ``D`` in /proc/<pid>/stat.
Checked by hand with torchrun 2.13 and the same script
(TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT=2,
``--nproc-per-node 2 --max-restarts 3``): torchrun logs "Worker pid=... stuck in uninterruptible
sleep (D-state) for 2.0s (>= 2.0s); marking worker group UNHEALTHY and disabling restarts",
sends SIGTERM to both workers, restarts none and exits 0; unirank run exits 1 (docs/run.md).
"""

from __future__ import annotations

import os
import select
import signal
import sys
from pathlib import Path

import pytest

from _procs import Runner
from unirank.errors import ConfigError
from unirank.supervisor import stoppolicy
from unirank.supervisor.dstate import DStateWatch, Dwell, dstate_timeout, parse_state, stuck_line
from unirank.supervisor.stoppolicy import StopRules, StopState
from unirank.supervisor.summary import RunResult, WorkerExit, format_summary

VAR = "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT"
RULES = StopRules(grace_period=30.0, kill_wait=30.0, signals=(int(signal.SIGTERM),))


def test_the_timeout_is_off_unless_the_variable_gives_a_positive_number() -> None:
    assert dstate_timeout({}) == 0.0
    assert dstate_timeout({VAR: " "}) == 0.0
    assert dstate_timeout({VAR: "0"}) == 0.0
    assert dstate_timeout({VAR: "-3"}) == 0.0  # torchrun: non-positive turns the check off
    assert dstate_timeout({VAR: "2.5"}) == 2.5


def test_a_value_that_is_not_a_number_is_refused_naming_the_variable() -> None:
    with pytest.raises(ConfigError) as err:
        dstate_timeout({VAR: "ten"})
    assert VAR in str(err.value) and "ten" in str(err.value)


def test_the_state_is_the_field_after_the_command_s_last_parenthesis() -> None:
    assert parse_state("42 (python3) D 1 42 42 0 -1") == "D"
    assert parse_state("42 (a) (b c) S 1 42") == "S"
    assert parse_state("42 (cut") is None
    assert parse_state("") is None


def test_a_worker_is_stuck_once_in_d_state_the_whole_timeout() -> None:
    dwell = Dwell(timeout=2.0)
    assert dwell.step({10: "D", 11: "S"}, now=100.0) == {}
    assert dwell.step({10: "D", 11: "D"}, now=101.0) == {}
    assert dwell.step({10: "D", 11: "D"}, now=102.0) == {10: 2.0}
    assert dwell.step({10: "D", 11: "D"}, now=103.5) == {10: 3.5, 11: 2.5}


def test_leaving_d_state_restarts_the_clock_and_unreadable_changes_nothing() -> None:
    dwell = Dwell(timeout=2.0)
    dwell.step({10: "D"}, now=100.0)
    assert dwell.step({10: None}, now=101.0) == {}  # unreadable: the clock runs on
    assert dwell.step({10: None}, now=102.0) == {}
    assert dwell.step({10: "D"}, now=102.0) == {10: 2.0}
    assert dwell.step({10: "R"}, now=103.0) == {}
    assert dwell.step({10: "D"}, now=104.0) == {}
    assert dwell.step({10: "D"}, now=105.9) == {}


def test_a_worker_that_ended_is_forgotten() -> None:
    dwell = Dwell(timeout=1.0)
    dwell.step({10: "D"}, now=100.0)
    dwell.step({}, now=100.5)
    assert dwell.step({10: "D"}, now=101.0) == {}  # a new pid 10 would start afresh


def test_the_line_names_each_stuck_worker_and_the_variable() -> None:
    line = stuck_line({12: 3.0, 11: 2.04}, {11: "rank 1 (local rank 1)"}, 2.0)
    assert line == ("rank 1 (local rank 1) (pid 11), a worker (pid 12) stuck in "
                    "uninterruptible sleep (D state) for 3.0 s (>= 2 s, " + VAR + "); no restart")


def test_stuck_workers_stop_the_others_with_the_grace_period() -> None:
    action = stoppolicy.on_stuck(StopState(), "rank 0 stuck", rules=RULES, now=10.0)
    assert action.stop == signal.SIGTERM
    assert action.state.stuck == "rank 0 stuck" and action.state.deadline == 40.0
    assert "rank 0 stuck; stopping the workers" in action.say
    # the workers it ends are not failures of their own
    assert not stoppolicy.is_first_failure(action.state, -int(signal.SIGTERM))


def test_stuck_workers_change_nothing_once_a_stop_is_under_way() -> None:
    for state in (StopState(failed=True), StopState(stop_signal=int(signal.SIGINT)),
                  StopState(world_changed="node lost")):
        action = stoppolicy.on_stuck(state, "rank 0 stuck", rules=RULES, now=10.0)
        assert action.stop is None and action.state == state


def test_a_run_ended_by_stuck_workers_exits_1() -> None:
    assert RunResult(exits=(), stuck="rank 0 stuck").exit_code == 1
    assert RunResult(exits=()).exit_code == 0


def test_the_summary_of_a_run_ended_by_a_stuck_worker_reads_as_the_golden_file() -> None:
    """``UNIRANK_REGEN_GOLDEN=1`` writes the file."""
    line = stuck_line({4242: 2.0}, {4242: "rank 0 (local rank 0)"}, 2.0)
    stopped = tuple(WorkerExit(r, r, "n1", -int(signal.SIGTERM), stopped=True) for r in (0, 1))
    text = format_summary(RunResult(exits=stopped, stuck=line))
    path = Path(__file__).resolve().parent.parent / "fixtures" / "summary" / "dstate.txt"
    if os.environ.get("UNIRANK_REGEN_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with UNIRANK_REGEN_GOLDEN=1"
    assert text == path.read_text()


def test_the_watch_wakes_the_engine_once_a_worker_stays_in_d_state() -> None:
    """The thread with a fake /proc reader (every worker always in D state)."""
    watch = DStateWatch(0.2, {7: "rank 0 (local rank 0)"}, alive=lambda: [7],
                        read=lambda pid: "D")
    try:
        ready, _, _ = select.select([watch.fileno()], [], [], 10.0)
        assert ready, "no wake-up within 10 s"
        assert (watch.stuck() or "").startswith("rank 0 (local rank 0) (pid 7) stuck")
    finally:
        watch.close()


VFORK = """
import ctypes, os, sys, time
print("attempt", os.environ["TORCHELASTIC_RESTART_COUNT"], "rank", os.environ["RANK"],
      flush=True)
if os.environ["RANK"] == "0":
    libc = ctypes.CDLL(None)
    if libc.vfork() == 0:  # the child sleeps before it exits: its parent waits in D state
        libc.sleep(60)
        libc._exit(0)
    print("resumed", flush=True)
else:
    time.sleep(60)
"""


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="D state is Linux's")
def test_a_worker_in_d_state_past_the_timeout_ends_the_run_without_restart(
        runner: Runner) -> None:
    runner.script("vfork.py", VFORK)
    result = runner.run(["-n", "2", "--max-restarts", "2", "vfork.py"], env={VAR: "1"})
    assert result.returncode == 1, result.stderr
    assert "rank 0 (local rank 0) (pid " in result.stderr
    assert "stuck in uninterruptible sleep (D state)" in result.stderr
    assert sorted(result.stdout.split("\n")) == ["", "attempt 0 rank 0", "attempt 0 rank 1"]
