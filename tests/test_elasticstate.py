"""``unirank.elasticstate``: UNIRANK_RESTART_REASON written by ``unirank run`` and read back
purely (a mapping in, a frozen ElasticState out, a ConfigError naming the variable on a
malformed value); the torchrun case (no reason) and a value left over from another run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from unirank.elasticstate import (
    ElasticState,
    RestartReason,
    nodes_changed,
    parse_reason,
    read_elastic_state,
)
from unirank.errors import ConfigError

LOST = RestartReason("node lost", "node nodeB (127.0.1.1) is lost: no beat for 5 s",
                     lost_nodes=("nodeB",))
FAILED = RestartReason("worker failed", "rank 1 on vm: exit code 3", rank=1, exit_code=3,
                       node="vm")


def _environ(count: int, reason: str | None = None, most: int = 3,
             world: int = 2) -> dict[str, str]:
    env = {"TORCHELASTIC_RESTART_COUNT": str(count), "TORCHELASTIC_MAX_RESTARTS": str(most),
           "WORLD_SIZE": str(world)}
    if reason is not None:
        env["UNIRANK_RESTART_REASON"] = reason
    return env


@pytest.mark.parametrize("reason", [LOST, FAILED])
def test_a_reason_written_for_an_attempt_is_read_back_by_its_workers(
        reason: RestartReason) -> None:
    state = read_elastic_state(_environ(1, reason.to_value(1, 4)))
    assert state == ElasticState(1, 3, 2, previous_world_size=4, reason=reason)
    assert state.restarted and state.resized and state.restarts_left == 2


def test_the_world_size_given_wins_over_world_size() -> None:
    state = read_elastic_state(_environ(1, LOST.to_value(1, 4)), world_size=4)
    assert (state.world_size, state.resized) == (4, False)


def test_a_first_attempt_has_no_reason_even_with_a_value_of_another_attempt_set() -> None:
    state = read_elastic_state(_environ(0, LOST.to_value(1, 4)))
    assert state == ElasticState(0, 3, 2)
    assert not state.restarted and state.describe() == "first attempt, world size 2"


JOINED = RestartReason("node joined", "1 node waiting to join", joined_nodes=("nodeB",))


@pytest.mark.parametrize("count", [0, 1])
def test_a_restart_for_nodes_joining_is_a_restart_that_spent_none(count: int) -> None:
    """Nodes joining spend no restart (torchrun's count): the attempt after has the count of
    the one before, 0 too, and is still a restarted one, with its reason."""
    state = read_elastic_state(_environ(count, JOINED.to_value(count, 2), world=4))
    assert state == ElasticState(count, 3, 4, previous_world_size=2, reason=JOINED)
    assert state.restarted and state.restarts_left == 3 - count
    assert state.describe() == (f"node joined: nodeB, no restart spent ({count} of 3 spent), "
                                "world size 2 -> 4")


def test_under_torchrun_the_count_is_known_and_the_reason_is_not() -> None:
    state = read_elastic_state(_environ(2))
    assert (state.restart_count, state.max_restarts, state.previous_world_size) == (2, 3, None)
    assert state.reason is not None and state.reason.kind == "unknown"
    assert state.describe() == "restart 2 of 3 (unknown), world size 2"


def test_a_value_of_another_attempt_is_not_taken_for_this_one() -> None:
    state = read_elastic_state(_environ(2, LOST.to_value(1, 4)))
    assert state.reason is not None and state.reason.kind == "unknown"
    assert state.previous_world_size is None


def test_no_launcher_at_all_is_a_first_attempt_of_one() -> None:
    assert read_elastic_state({}) == ElasticState(0, 0, 1)


def test_describe_says_the_restart_the_cause_and_the_resize() -> None:
    lost = read_elastic_state(_environ(1, LOST.to_value(1, 4)))
    assert lost.describe() == "restart 1 of 3 (node lost: nodeB), world size 4 -> 2"
    failed = read_elastic_state(_environ(1, FAILED.to_value(1, 2)))
    assert failed.describe() == "restart 1 of 3 (worker failed: rank 1 on vm (exit code 3)), " \
                                "world size 2"


def test_the_state_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        read_elastic_state({}).restart_count = 2  # type: ignore[misc]


@pytest.mark.parametrize(("value", "what"), [
    ("node lost", "is not a JSON object"),
    ("[1, 2]", "is not a JSON object"),
    ('{"attempt": 1}', "has no valid 'previous_world_size'"),
    (LOST.to_value(1, 4).replace('"node lost"', '"meteor"'), "has an unknown kind 'meteor'"),
    (LOST.to_value(1, 4).replace('"attempt": 1', '"attempt": true'), "has no valid 'attempt'"),
    (LOST.to_value(1, 4).replace('["nodeB"]', '[7]'), "has no valid 'lost_nodes'"),
    (FAILED.to_value(1, 4).replace('"rank": 1', '"rank": "1"'), "has no valid 'rank'"),
])
def test_a_malformed_value_is_one_line_naming_the_variable(value: str, what: str) -> None:
    with pytest.raises(ConfigError) as caught:
        read_elastic_state(_environ(1, value))
    assert caught.value.variable == "UNIRANK_RESTART_REASON"
    assert what in str(caught.value) and "\n" not in str(caught.value)


def test_a_bad_restart_count_names_its_variable() -> None:
    with pytest.raises(ConfigError) as caught:
        read_elastic_state({"TORCHELASTIC_RESTART_COUNT": "one"})
    assert caught.value.variable == "TORCHELASTIC_RESTART_COUNT"


def test_parse_reason_gives_the_attempt_and_the_world_before() -> None:
    assert parse_reason(FAILED.to_value(3, 8)) == (3, 8, FAILED)


def test_nodes_changed_counts_names_twice() -> None:
    assert nodes_changed(("a", "b", "b"), ("b", "c")) == (("a", "b"), ("c",))
    assert nodes_changed(("a",), ("a",)) == ((), ())


def test_the_slow_link_is_the_one_the_node_s_unirank_run_keeps(tmp_path: Path) -> None:
    """``ur.elastic_state().slow_link``: the node this node's ``unirank run`` was told of
    (its run folder's file, found from the worker's attempt folder); "" without one."""
    from unirank.runfolder import RunFolder, write_slow_link
    from unirank.runtime.state import elastic_state

    root = RunFolder(str(tmp_path))
    environ = {"UNIRANK_ATTEMPT_DIR": root.attempt(1).path, "WORLD_SIZE": "2"}
    assert elastic_state(environ).slow_link == ""
    write_slow_link(root.slow_link_file, "vm (10.0.0.3)")
    assert elastic_state(environ).slow_link == "vm (10.0.0.3)"
    write_slow_link(root.slow_link_file, "")  # no longer
    assert elastic_state(environ).slow_link == ""
    assert elastic_state({"WORLD_SIZE": "2"}).slow_link == ""
