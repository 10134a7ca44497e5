"""The one rule for naming a node of the dynamic rendezvous in messages (pure; dicts in)."""

from __future__ import annotations

from unirank.supervisor.rdzv.names import node_label, node_labels, of_records

TWO_ON_ONE_HOST = {"vm:11:a": {"name": "vm", "addr": "127.0.0.1", "pid": 11},
                   "vm:22:b": {"name": "vm", "addr": "127.0.0.1", "pid": 22}}
TWO_PODS = {"p0": {"name": "train-worker-0", "addr": "10.0.0.7", "pid": 1},
            "p1": {"name": "train-worker-1", "addr": "10.0.0.9", "pid": 1}}


def test_a_unique_name_is_enough() -> None:
    assert node_label("p1", TWO_PODS) == "train-worker-1"


def test_address_asked_for_is_the_node_s_own() -> None:
    assert node_label("p1", TWO_PODS, address=True) == "train-worker-1 (10.0.0.9)"
    assert node_label("p0", TWO_PODS, address=True) == "train-worker-0 (10.0.0.7)"


def test_two_nodes_on_one_host_are_told_apart_by_pid() -> None:
    assert node_label("vm:11:a", TWO_ON_ONE_HOST) == "vm (127.0.0.1, pid 11)"
    assert node_label("vm:22:b", TWO_ON_ONE_HOST, address=True) == "vm (127.0.0.1, pid 22)"
    assert node_labels(["vm:22:b", "vm:11:a"], TWO_ON_ONE_HOST) == [
        "vm (127.0.0.1, pid 11)", "vm (127.0.0.1, pid 22)"]


def test_one_name_at_two_addresses_is_told_apart_by_address() -> None:
    nodes = {"a": {"name": "node", "addr": "10.0.0.1", "pid": 5},
             "b": {"name": "node", "addr": "10.0.0.2", "pid": 5}}
    assert node_label("a", nodes) == "node (10.0.0.1)"


def test_an_unknown_node_is_its_identity() -> None:
    assert node_label("x:1:c", {}) == "x:1:c"
    assert node_label("x:1:c", {}, address=True) == "x:1:c"


def test_records_give_the_address_the_server_saw() -> None:
    records = [{"claim": "p1", "name": "train-worker-1", "addr": "train-worker-0",
                "seen_addr": "10.0.0.9", "pid": 7},
               {"claim": "p0", "name": "train-worker-0", "addr": "train-worker-0", "pid": 3}]
    nodes = of_records(records)
    assert node_label("p1", nodes, address=True) == "train-worker-1 (10.0.0.9)"
    assert node_label("p0", nodes, address=True) == "train-worker-0 (train-worker-0)"
