"""``--on-slow evict``'s rule (unirank.hang.slowcost) and its settings (unirank.contract): a
straggler's node is evicted where the throughput it gains repays a restart within the payback
time, never taking the world below its fewest nodes; pure."""

from __future__ import annotations

from typing import Any

import pytest

from unirank.contract import (
    ELASTIC_VAR,
    ON_SLOW_VAR,
    HangSettings,
    on_slow_now,
    resolve_hang,
    resolve_on_slow,
)
from unirank.errors import ConfigError
from unirank.hang.slowcost import (
    PAYBACK_S,
    RESTART_COST_S,
    gain,
    node_ranks,
    slow_verdict,
    to_evict,
)
from unirank.hang.straggle import Straggler
from unirank.supervisor.restartreason import evicted_ranks, evicted_why, nothing_to_evict


def _records(nodes: dict[int, str]) -> dict[int, dict[str, Any] | None]:
    return {rank: {"rank": rank, "node": node} for rank, node in nodes.items()}


def test_a_node_at_half_speed_of_two_is_kept_one_at_a_fifth_is_evicted() -> None:
    records = _records({0: "nodeA", 1: "nodeB"})
    assert to_evict([Straggler(1, "nodeB", 0.5)], records, 2) is None
    assert to_evict([Straggler(1, "nodeB", 0.8)], records, 2) == (Straggler(1, "nodeB", 0.8),
                                                                 [1])


def test_the_rule_is_the_gain_times_the_payback_against_the_restart() -> None:
    threshold = 0.5 + RESTART_COST_S / PAYBACK_S  # two nodes of one rank each
    records = _records({0: "nodeA", 1: "nodeB"})
    assert gain(threshold, 1, 2) * PAYBACK_S == pytest.approx(RESTART_COST_S)
    assert to_evict([Straggler(1, "nodeB", threshold + 0.01)], records, 2) is not None
    assert to_evict([Straggler(1, "nodeB", threshold - 0.01)], records, 2) is None


def test_the_whole_node_goes_and_the_worst_straggler_first() -> None:
    records = _records({0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"})
    named = [Straggler(2, "b", 0.5), Straggler(4, "c", 0.7)]
    assert to_evict(named, records, 6) == (Straggler(4, "c", 0.7), [4, 5])


def test_a_straggler_whose_node_holds_every_rank_is_not_evicted() -> None:
    records = _records({0: "a", 1: "a"})
    assert to_evict([Straggler(1, "a", 0.9)], records, 2) is None


def test_two_nodes_of_one_host_are_told_apart_by_their_node_rank() -> None:
    records: dict[int, dict[str, Any] | None] = {
        0: {"rank": 0, "node": "vm", "group": 0}, 1: {"rank": 1, "node": "vm", "group": 1},
        2: {"rank": 2, "node": "vm", "group": 1}, 3: None}
    assert node_ranks(records, 1) == [1, 2]
    assert to_evict([Straggler(1, "vm", 0.9)], records, 4) == (Straggler(1, "vm", 0.9), [1, 2])
    del records[1]["group"]  # no node rank: the host's name, which holds every rank here
    assert node_ranks(records, 1) == [0, 1, 2]


def test_the_verdict_names_the_node_s_ranks_and_says_why() -> None:
    verdict = slow_verdict(Straggler(4, "c", 0.7), [4, 5])
    assert evicted_ranks(verdict) == [4, 5]
    assert evicted_why(verdict) == "node evicted: rank 4 kept the others waiting 70 % of the time"
    assert nothing_to_evict(verdict) == ""
    assert evicted_ranks({"never_entered": [1], "call": "all_reduce #3"}) == [1]


def test_on_slow_is_warn_unless_asked_and_evict_needs_an_elastic_job() -> None:
    assert resolve_on_slow(None, {}, elastic=True) == "warn"
    assert resolve_on_slow(None, {ON_SLOW_VAR: " Evict "}, elastic=True) == "evict"
    assert resolve_on_slow("warn", {ON_SLOW_VAR: "evict"}, elastic=True) == "warn"
    with pytest.raises(ConfigError) as bad:
        resolve_on_slow("evict", {}, elastic=False)
    assert str(bad.value).startswith("--on-slow='evict': needs an elastic job")
    assert resolve_on_slow("replace", {}, elastic=True) == "replace"
    with pytest.raises(ConfigError) as static:
        resolve_on_slow("replace", {}, elastic=False)
    assert str(static.value).startswith("--on-slow='replace': needs an elastic job")
    with pytest.raises(ConfigError) as odd:
        resolve_on_slow(None, {ON_SLOW_VAR: "swap"}, elastic=True)
    assert "UNIRANK_ON_SLOW='swap'" in str(odd.value) and "warn, evict, replace" in \
        str(odd.value)


def test_an_attempt_evicts_only_above_its_fewest_nodes() -> None:
    assert on_slow_now("evict", 3, 2) == "evict"
    assert on_slow_now("evict", 2, 2) == "warn"
    assert on_slow_now("evict", 2, 1) == "evict"
    assert on_slow_now("evict", 1, 1) == "warn"
    assert on_slow_now("warn", 3, 1) == "warn"
    assert on_slow_now("replace", 2, 2) == "replace"  # a spare keeps the world's size


def test_a_waiting_spare_makes_an_eviction_cost_no_capacity_and_replace_needs_one() -> None:
    """Two nodes of one rank: at half speed the node is kept (evicting it would leave the job
    at half speed too), but with a spare waiting it goes (the spare takes its place); under
    ``replace`` nothing goes without a spare, and a share under a tenth never pays."""
    records = _records({0: "nodeA", 1: "nodeB"})
    half = [Straggler(1, "nodeB", 0.5)]
    assert to_evict(half, records, 2) is None
    assert to_evict(half, records, 2, spares=1) == (half[0], [1])
    assert to_evict(half, records, 2, spares=1, only_replaced=True) == (half[0], [1])
    fifth = [Straggler(1, "nodeB", 0.8)]
    assert to_evict(fifth, records, 2, only_replaced=True) is None
    threshold = RESTART_COST_S / PAYBACK_S
    assert to_evict([Straggler(1, "nodeB", threshold - 0.01)], records, 2, spares=1) is None
    assert to_evict([Straggler(1, "nodeB", threshold + 0.01)], records, 2, spares=1) \
        is not None


def test_the_workers_read_back_the_attempt_s_choice() -> None:
    settings = HangSettings(on_slow="evict")
    env = {**settings.environ(), ELASTIC_VAR: "1"}
    assert resolve_hang(None, None, env).on_slow == "evict"
    assert resolve_hang(None, None, {**env, ON_SLOW_VAR: "warn"}).on_slow == "warn"
    assert resolve_hang(None, None, {ON_SLOW_VAR: "evict", ELASTIC_VAR: "1",
                                     "UNIRANK_HANG_REPORT_AFTER": "off"}).on_slow == "warn"


def test_the_docs_give_the_rule_with_the_code_s_numbers() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md").read_text()
    assert f"`(f - k/N) x {PAYBACK_S:g} >= {RESTART_COST_S:g}`" in text
    assert f"taken as {RESTART_COST_S:g} s of the whole job" in text
    assert f"within {PAYBACK_S / 60:g} minutes" in text
    # the evicted node's line, as the code says it
    said = evicted_why(slow_verdict(Straggler(1, "nodeB", 0.8), [1]))
    assert f"unirank run: error: {said} HINT: the other nodes go on without this one" in text


def test_the_option_is_read_once_and_wins_over_the_variable() -> None:
    env = {ON_SLOW_VAR: "bogus", ELASTIC_VAR: "1"}
    assert resolve_hang(None, None, env, on_slow="evict").on_slow == "evict"
    with pytest.raises(ConfigError):
        resolve_hang(None, None, env)
