"""Which node's link is slow, by its beats' round trips (unirank.supervisor.rdzv.linkrule):
pure (the server's echo: tests/supervisor/test_rdzv_change.py)."""

from __future__ import annotations

from unirank.supervisor.rdzv.linkrule import FACTOR, FLOOR_US, odd_link


def test_the_node_whose_beats_wait_behind_its_traffic_is_named() -> None:
    # measured in network namespaces: 3 ms against 0.1-0.2 ms with a 200 Mbit/s tbf on one
    assert odd_link({"a": 150, "b": 200, "c": 3200}, "a") == ("c", 3200, 200)
    assert odd_link({"a": 150, "b": 200, "c": 190, "d": 5000}, "a") == ("d", 5000, 190)


def test_the_server_s_own_link_is_named_when_every_other_node_s_beats_wait() -> None:
    assert odd_link({"a": 100, "b": 3000, "c": 4000}, "a") == ("a", 4000, 100)


def test_jitter_a_loaded_host_and_two_nodes_name_nobody() -> None:
    assert odd_link({"a": 150, "b": 900, "c": 200}, "a") is None  # under the floor
    assert odd_link({"a": 2000, "b": 3000, "c": 2500}, "a") is None  # all alike: a busy host
    assert odd_link({"a": 100, "b": 5000}, "a") is None  # two nodes: either end's link


def test_the_bound_is_the_factor_and_the_floor() -> None:
    base = 400
    slow = int(FACTOR * base)
    assert slow >= FLOOR_US
    assert odd_link({"a": base, "b": base, "c": slow}, "a") is not None
    assert odd_link({"a": base, "b": base, "c": slow - 1}, "a") is None
