"""The supervisor's stop policy (:mod:`unirank.supervisor.stoppolicy`), decision by decision:
plain states and events in, actions out; no process, no signal, no clock (``now`` is given)."""

from __future__ import annotations

import signal
from dataclasses import replace

import pytest

from unirank.exitcodes import REQUEUE as REQUEUE_EXIT_CODE
from unirank.supervisor.stoppolicy import (
    CANNOT_RETURN_WHY,
    NODE_GONE_WHY,
    Action,
    StopRules,
    StopState,
    is_failure,
    is_first_failure,
    on_first_failure,
    on_forwarded_end,
    on_report_end,
    on_signal,
    on_tick,
    on_world_change,
)

INT, TERM, USR1, USR2 = (int(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1,
                                          signal.SIGUSR2))
RULES = StopRules(grace_period=30.0, kill_wait=5.0, signals=(INT, TERM, USR1, USR2))
SLURM = replace(RULES, slurm_kills=True)
NOW = 1000.0
WHO = "rank 1 (local rank 1) on node n1 ended with exit code 3"


def waits() -> bool:
    return True


def _never() -> bool:
    raise AssertionError("the hang report's mark was looked at where no report can be asked")


# -- signals ------------------------------------------------------------------------------------


def test_a_first_sigint_is_forwarded_to_the_groups_and_starts_the_grace_period() -> None:
    action = on_signal(StopState(), INT, RULES, NOW)
    assert action.stop == INT and not action.kill and action.forward is None
    assert action.state.stop_signal == INT
    assert action.state.deadline == NOW + 30.0 and not action.state.killing
    assert action.say == ("got SIGINT: forwarded to the workers; SIGKILL in 30 s (SIGINT again "
                          "to kill now)")


def test_a_second_stop_signal_kills_at_once_and_waits_kill_wait() -> None:
    first = on_signal(StopState(), INT, RULES, NOW).state
    second = on_signal(first, TERM, RULES, NOW + 1)
    assert second.kill and second.stop is None and not second.say
    assert second.state.killing and second.state.deadline == NOW + 1 + 5.0
    assert second.state.stop_signal == INT  # the first one is the run's


def test_usr1_is_forwarded_to_each_worker_s_process_and_stops_nothing() -> None:
    action = on_signal(StopState(), USR1, RULES, NOW)
    assert action == Action(StopState(), forward=USR1)


@pytest.mark.parametrize("signum", [int(signal.SIGCHLD), int(signal.SIGHUP)])
def test_a_signal_not_handled_changes_nothing(signum: int) -> None:
    assert on_signal(StopState(), signum, RULES, NOW) == Action(StopState())


@pytest.mark.parametrize("signum", [int(signal.SIGHUP), int(signal.SIGQUIT)])
@pytest.mark.parametrize("rules", [RULES, SLURM], ids=["", "slurm"])
def test_sighup_and_sigquit_stop_as_sigint_and_sigterm(signum: int, rules: StopRules) -> None:
    """torchrun's agent treats SIGTERM, SIGINT, SIGHUP and SIGQUIT alike (a closed terminal
    stops the job): forwarded to the groups, the grace period (also under Slurm, whose own
    SIGTERM alone comes with KillWait), no failure, a second one kills."""
    rules = replace(rules, signals=(*rules.signals, signum))
    action = on_signal(StopState(), signum, rules, NOW)
    name = signal.Signals(signum).name
    assert action.stop == signum and action.forward is None and not action.kill
    assert action.state.stop_signal == signum and action.state.deadline == NOW + 30.0
    assert action.say == (f"got {name}: forwarded to the workers; SIGKILL in 30 s ({name} "
                          "again to kill now)")
    assert not is_first_failure(action.state, -signum)  # the worker it ended: stopped
    assert on_signal(action.state, signum, rules, NOW + 1).kill


def test_a_stop_signal_not_among_the_handled_ones_is_not_forwarded() -> None:
    rules = replace(RULES, signals=(USR2,))
    assert on_signal(StopState(), TERM, rules, NOW) == Action(StopState())


def test_slurm_s_sigterm_is_forwarded_without_a_deadline_and_again_without_a_kill() -> None:
    first = on_signal(StopState(), TERM, SLURM, NOW, _never)
    assert first.stop == TERM and not first.say
    assert first.state.deadline is None and first.state.stop_signal == TERM
    second = on_signal(first.state, TERM, SLURM, NOW + 1, _never)
    assert second.stop == TERM and not second.kill and second.state.deadline is None


def test_under_slurm_a_sigint_still_has_its_grace_period() -> None:
    action = on_signal(StopState(), INT, SLURM, NOW)
    assert action.state.deadline == NOW + 30.0 and action.say


def test_a_stop_signal_after_a_failure_kills_at_once() -> None:
    failed = on_first_failure(StopState(), others=1, config_error=False, who=WHO, rules=RULES,
                              now=NOW).state
    action = on_signal(failed, INT, RULES, NOW + 2)
    assert action.kill and action.state.stop_signal is None


def test_a_worker_ended_by_a_forwarded_signal_stops_the_run() -> None:
    """SIGUSR1 forwarded to a worker whose program does not handle it: stopped, not failed;
    the run is stopped by it (no restart, 128 + the signal), the others get SIGTERM."""
    who = "rank 1 (local rank 1) on node n1 was killed by SIGUSR1 (signal 10)"
    action = on_forwarded_end(StopState(), USR1, others=1, who=who, rules=RULES, now=NOW)
    assert action.stop == TERM and action.state.stop_signal == USR1 and not action.state.failed
    assert action.state.deadline == NOW + 30.0
    assert action.say == (f"{who}, forwarded to it by the launcher (its program does not "
                          "handle it); stopping the other 1 worker: SIGTERM now, SIGKILL after "
                          "30 s")
    assert on_forwarded_end(StopState(), USR1, others=0, who=who, rules=RULES,
                            now=NOW) == Action(StopState(stop_signal=USR1))
    stopping = on_signal(StopState(), INT, RULES, NOW).state
    assert on_forwarded_end(stopping, USR1, others=1, who=who, rules=RULES,
                            now=NOW) == Action(stopping)


# -- the hang report at a stop --------------------------------------------------------------------


def test_the_first_stop_signal_waits_for_the_hang_report_when_a_rank_waits() -> None:
    action = on_signal(StopState(), INT, RULES, NOW, waits)
    assert action.ask_report and action.stop is None and not action.kill
    assert action.state.reporting == INT and action.state.report_asked
    assert action.state.stop_signal is None and action.state.deadline is None


def test_no_report_when_no_rank_waits() -> None:
    action = on_signal(StopState(), INT, RULES, NOW, lambda: False)
    assert not action.ask_report and action.stop == INT


def test_slurm_s_sigterm_never_waits_for_the_report() -> None:
    action = on_signal(StopState(), TERM, SLURM, NOW, _never)
    assert not action.ask_report and action.stop == TERM


def test_the_signal_is_forwarded_when_the_report_ends() -> None:
    asked = on_signal(StopState(), TERM, RULES, NOW, waits).state
    action = on_report_end(asked, RULES, NOW + 3)
    assert action.stop == TERM and not action.ask_report and not action.drop_report
    assert action.state.reporting is None and action.state.stop_signal == TERM
    assert action.state.deadline == NOW + 3 + 30.0


def test_a_report_of_collectives_that_cannot_return_ends_the_waiting_workers_early() -> None:
    """The report found calls that do not match: the workers waiting in a collective cannot
    run their stop handler, so they are ended after ``peer_wait``, not the grace period."""
    asked = on_signal(StopState(), INT, RULES, NOW, waits).state
    action = on_report_end(asked, RULES, NOW + 3, cannot_return=True)
    assert action.stop == INT and action.state.deadline == NOW + 3 + 30.0
    assert action.state.peer_deadline == NOW + 3 + RULES.peer_wait
    assert action.state.waiting_why == CANNOT_RETURN_WHY
    assert "at 2 s for those waiting in a collective, which cannot return" in action.say
    assert not on_tick(action.state, RULES, NOW + 4.9).end_waiting
    assert on_tick(action.state, RULES, NOW + 5).end_waiting
    plain = on_report_end(asked, RULES, NOW + 3)  # a report of ranks late, not mismatched
    assert plain.state.peer_deadline is None and "cannot return" not in plain.say
    short = replace(RULES, grace_period=1.0)  # the grace period ends first anyway
    assert on_report_end(asked, short, NOW + 3, cannot_return=True).state.peer_deadline is None


def test_a_second_signal_during_the_report_drops_it_and_kills() -> None:
    asked = on_signal(StopState(), INT, RULES, NOW, waits).state
    action = on_signal(asked, INT, RULES, NOW + 1, _never)
    assert action.drop_report and action.kill and action.stop is None
    assert action.state.reporting is None and action.state.stop_signal == INT
    assert action.state.killing


def test_the_report_is_asked_for_once_per_run() -> None:
    state = StopState(report_asked=True)
    action = on_signal(state, INT, RULES, NOW, _never)
    assert not action.ask_report and action.stop == INT


def test_a_failure_during_the_report_then_its_end_kills() -> None:
    """A worker failed while the report was made (the others got SIGTERM): the waiting stop
    signal is then a second stop signal."""
    asked = on_signal(StopState(), INT, RULES, NOW, waits).state
    failed = on_first_failure(asked, others=1, config_error=False, who=WHO, rules=RULES,
                              now=NOW + 1).state
    action = on_report_end(failed, RULES, NOW + 2)
    assert action.kill


def test_a_report_end_without_a_report_changes_nothing() -> None:
    assert on_report_end(StopState(), RULES, NOW) == Action(StopState())


# -- failures ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "failed"), [(0, False), (REQUEUE_EXIT_CODE, False), (1, True),
                                              (3, True), (-9, True), (-15, True)])
def test_what_is_a_failure(code: int, failed: bool) -> None:
    assert is_failure(code) is failed


def test_only_the_first_failure_before_any_stop_is_the_first_failure() -> None:
    assert is_first_failure(StopState(), 3)
    assert not is_first_failure(StopState(), 0)
    assert not is_first_failure(StopState(failed=True), 3)
    assert not is_first_failure(StopState(stop_signal=INT), 3)
    assert not is_first_failure(StopState(world_changed="node n2 lost"), 3)


def test_the_first_failure_stops_the_others_with_sigterm_and_says_who() -> None:
    action = on_first_failure(StopState(), others=3, config_error=False, who=WHO, rules=RULES,
                              now=NOW)
    assert action.stop == TERM and action.state.failed
    assert action.state.deadline == NOW + 30.0
    assert action.say == (f"{WHO}; stopping the other 3 workers: SIGTERM now, SIGKILL after "
                          "30 s")


def test_a_configuration_error_stops_the_others_without_a_line() -> None:
    action = on_first_failure(StopState(), others=1, config_error=True, who=WHO, rules=RULES,
                              now=NOW)
    assert action.stop == TERM and not action.say and action.state.failed


def test_the_last_worker_s_failure_is_noted_and_stops_no_one() -> None:
    action = on_first_failure(StopState(), others=0, config_error=False, who=WHO, rules=RULES,
                              now=NOW)
    assert action == Action(StopState(failed=True))


def test_a_failure_keeps_a_grace_period_that_runs_already() -> None:
    state = StopState(deadline=NOW + 7)
    action = on_first_failure(state, others=1, config_error=False, who=WHO, rules=RULES,
                              now=NOW + 1)
    assert action.state.deadline == NOW + 7


# -- a change of the world ---------------------------------------------------------------------


def test_a_change_of_the_world_stops_the_workers() -> None:
    action = on_world_change(StopState(), "node n2 was lost", alive=True, rules=RULES, now=NOW)
    assert action.stop == TERM and action.state.world_changed == "node n2 was lost"
    assert action.state.deadline == NOW + 30.0
    assert action.say == ("node n2 was lost; stopping the workers: SIGTERM now, SIGKILL after "
                          "30 s")


@pytest.mark.parametrize("state", [StopState(failed=True), StopState(stop_signal=INT)])
def test_a_change_of_the_world_while_stopping_changes_nothing(state: StopState) -> None:
    assert on_world_change(state, "x", alive=True, rules=RULES, now=NOW) == Action(state)


def test_a_change_of_the_world_with_no_worker_left_changes_nothing() -> None:
    assert on_world_change(StopState(), "x", alive=False, rules=RULES, now=NOW) == \
        Action(StopState())


def test_a_worker_that_fails_after_a_change_of_the_world_is_no_first_failure() -> None:
    changed = on_world_change(StopState(), "x", alive=True, rules=RULES, now=NOW).state
    assert not is_first_failure(changed, -15)


def test_a_node_gone_ends_the_workers_waiting_in_a_collective_after_the_short_wait() -> None:
    """A lost or frozen node: the workers blocked in a collective with it cannot run their
    stop handler, so those that wait in one get SIGKILL at ``peer_wait`` (LOST_PEER_WAIT), and
    again every ``peer_wait`` until the grace period ends; the others keep the grace period."""
    from unirank.contract import LOST_PEER_WAIT

    assert 0 < RULES.peer_wait == LOST_PEER_WAIT < RULES.grace_period
    action = on_world_change(StopState(), "node n2 was lost", alive=True, rules=RULES, now=NOW,
                             node_gone=True)
    assert action.stop == TERM and action.state.deadline == NOW + 30.0
    assert action.state.peer_deadline == NOW + RULES.peer_wait
    assert action.state.waiting_why == NODE_GONE_WHY
    assert action.say == (f"node n2 was lost; stopping the workers: SIGTERM now, SIGKILL after "
                          f"30 s (at {RULES.peer_wait:g} s for those waiting in a collective)")
    state = action.state
    assert on_tick(state, RULES, NOW + RULES.peer_wait - 0.1) == Action(state)
    tick = on_tick(state, RULES, NOW + RULES.peer_wait)
    assert tick.end_waiting and not tick.kill and tick.stop is None
    assert tick.state.peer_deadline == NOW + 2 * RULES.peer_wait  # looked at again
    assert tick.state.deadline == NOW + 30.0 and not tick.state.killing
    killed = on_tick(tick.state, RULES, NOW + 30.0)  # the grace period's end: every worker
    assert killed.kill and not killed.end_waiting and killed.state.peer_deadline is None
    assert on_tick(killed.state, RULES, NOW + 30.0 + RULES.peer_wait) == Action(killed.state)


def test_nodes_joining_keep_the_whole_grace_period() -> None:
    """Nodes waiting to join: every peer is alive, collectives end, the stop handler runs."""
    action = on_world_change(StopState(), "1 node waiting to join", alive=True, rules=RULES,
                             now=NOW)
    assert action.state.peer_deadline is None and "collective" not in action.say
    assert not on_tick(action.state, RULES, NOW + 29.9).end_waiting


def test_no_short_wait_where_the_grace_period_is_shorter() -> None:
    rules = replace(RULES, grace_period=1.0)
    action = on_world_change(StopState(), "x", alive=True, rules=rules, now=NOW, node_gone=True)
    assert action.state.peer_deadline is None


def test_a_second_stop_signal_after_a_node_gone_kills_everyone() -> None:
    gone = on_world_change(StopState(), "x", alive=True, rules=RULES, now=NOW,
                           node_gone=True).state
    action = on_signal(gone, INT, RULES, NOW + 1)
    assert action.stop == INT and not action.kill  # the world change's SIGTERM came first
    again = on_signal(action.state, INT, RULES, NOW + 1.5)
    assert again.kill and again.state.peer_deadline is None


# -- the clock ---------------------------------------------------------------------------------


def test_nothing_happens_before_the_deadline() -> None:
    state = on_signal(StopState(), INT, RULES, NOW).state
    assert on_tick(state, RULES, NOW + 29.9) == Action(state)
    assert on_tick(StopState(), RULES, NOW + 1e9) == Action(StopState())


def test_the_end_of_the_grace_period_kills_then_the_end_of_kill_wait_gives_up() -> None:
    state = on_signal(StopState(), INT, RULES, NOW).state
    kill = on_tick(state, RULES, NOW + 30.0)
    assert kill.kill and kill.state.killing and kill.state.deadline == NOW + 35.0
    assert not on_tick(kill.state, RULES, NOW + 34.0).give_up
    assert on_tick(kill.state, RULES, NOW + 35.0).give_up
