"""The dynamic rendezvous's pure parts: the order of the nodes (:func:`assign`), the messages
between the parent and its helper, and when ``unirank run`` takes the dynamic rendezvous."""

from __future__ import annotations

import argparse

import pytest

from unirank.cli import elastic
from unirank.cli.run import add_arguments
from unirank.errors import ConfigError
from unirank.supervisor.rdzv.spec import Assignment, NodeRecord, assign, assignment_of, to_line


def _record(addr: str, nproc: int = 2, serves: bool = False) -> NodeRecord:
    return NodeRecord(addr=addr, name=f"n-{addr}", nproc=nproc, store_port=4000 + nproc,
                      serves_endpoint=serves, claim=addr)


def test_the_node_serving_the_endpoint_is_node_rank_0_then_torch_s_order() -> None:
    records = [_record("a", 1), _record("b", 3, serves=True), _record("c", 2)]
    assert [assign(records, own).node_rank for own in range(3)] == [1, 0, 2]
    first = assign(records, 2)
    assert first.ranks_per_node == (3, 1, 2)
    assert first.hosts == ("n-b", "n-a", "n-c")
    assert (first.master_addr, first.master_port) == ("b", 4003)


def test_without_a_node_on_the_endpoint_torch_s_order_stays() -> None:
    records = [_record("a"), _record("b")]
    assert [assign(records, own).node_rank for own in range(2)] == [0, 1]
    assert assign(records, 1).master_addr == "a"


def test_an_answer_round_trips_and_a_refusal_is_its_one_line() -> None:
    answer = Assignment(node_rank=1, nnodes=2, ranks_per_node=(2, 2), hosts=("x", "y"),
                        master_addr="x", master_port=5)
    assert assignment_of(to_line(answer).decode(), where="helper") == answer
    refusal = to_line({"error": "is taken", "variable": "--local-addr", "value": "h",
                       "hint": "pick another"}).decode()
    with pytest.raises(ConfigError, match=r"^--local-addr='h': is taken HINT: pick another$"):
        assignment_of(refusal, where="helper")
    with pytest.raises(ConfigError, match="helper answered 'garbage'"):
        assignment_of("garbage", where="helper")


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args([*argv, "train.py"])


@pytest.mark.parametrize(("argv", "dynamic"), [
    (["--rdzv-backend", "c10d", "--nnodes", "2"], True),
    (["--rdzv-backend", "c10d", "--nnodes", "1:2"], True),
    (["--rdzv_backend=c10d", "--nnodes", "2:2"], True),
    (["--rdzv-backend", "c10d", "--nnodes", "1"], False),
    (["--rdzv-backend", "c10d", "--nnodes", "1:1"], False),
    (["--rdzv-backend", "c10d", "--nnodes", "2", "--node-rank", "0"], False),
    (["--rdzv-backend", "static", "--nnodes", "2"], False),
    (["--rdzv-backend", "c10d"], False),
    (["--rdzv-backend", "c10d", "--nnodes", "2", "--standalone"], False),
])
def test_when_the_rendezvous_is_dynamic(argv: list[str], dynamic: bool) -> None:
    from unirank.launchers import detect

    assert elastic.wanted(_args(*argv), detect({}, argv=[])) is dynamic


def test_a_new_round_names_the_nodes_that_left_or_joined() -> None:
    def place(*hosts: str, round_: int = 0) -> Assignment:
        return Assignment(node_rank=0, nnodes=len(hosts), ranks_per_node=(2,) * len(hosts),
                          hosts=hosts, master_addr="a", master_port=1, round=round_)

    assert elastic.describe_round(place("a", "b"), place("a", round_=1)) == \
        "rendezvous round 1: node rank 0 of 1, 2 workers in all (left: b)"
    assert elastic.describe_round(place("a", "b"), place("a", "c", round_=2)) == \
        "rendezvous round 2: node rank 0 of 2, 4 workers in all (left: b; joined: c)"
    assert elastic.describe_round(place("a"), place("a", round_=1)) == \
        "rendezvous round 1: node rank 0 of 1, 2 workers in all"
    assert elastic.describe_round(place("a", "b"), place("a", round_=1), 3.04) == \
        "rendezvous round 1: node rank 0 of 1, 2 workers in all (left: b), after 3.0 s of " \
        "rendezvous"


def test_a_new_round_tells_two_nodes_of_one_host_apart() -> None:
    """Two nodes ``vm`` on one address: the one that left is named with its pid; one started
    again (a new identity) joined."""
    def place(*nodes: tuple[str, int], round_: int = 0) -> Assignment:
        return Assignment(node_rank=0, nnodes=len(nodes), ranks_per_node=(1,) * len(nodes),
                          hosts=("vm",) * len(nodes), master_addr="127.0.0.1", master_port=1,
                          round=round_, nodes=tuple(f"vm:{pid}:{key}" for key, pid in nodes),
                          addrs=("127.0.0.1",) * len(nodes),
                          pids=tuple(pid for _key, pid in nodes))

    assert elastic.describe_round(place(("a", 11), ("b", 22)), place(("a", 11), round_=1)) == \
        "rendezvous round 1: node rank 0 of 1, 1 worker in all (left: vm (127.0.0.1, pid 22))"
    assert elastic.describe_round(place(("a", 11)), place(("a", 11), ("c", 33), round_=2)) == \
        "rendezvous round 2: node rank 0 of 2, 2 workers in all (joined: vm (127.0.0.1, pid 33))"


def test_a_new_round_after_news_says_how_long_the_workers_took_to_stop() -> None:
    before = Assignment(node_rank=0, nnodes=2, ranks_per_node=(1, 1), hosts=("a", "b"),
                        master_addr="a", master_port=1)
    after = Assignment(node_rank=0, nnodes=1, ranks_per_node=(1,), hosts=("a",),
                       master_addr="a", master_port=1, round=1)
    assert elastic.describe_round(before, after, 0.04, 0.21) == \
        "rendezvous round 1: node rank 0 of 1, 1 worker in all (left: b), the workers " \
        "stopped 0.2 s after the news, after 0.0 s of rendezvous"


def test_the_nodes_of_ranks_and_the_eviction_of_a_verdict() -> None:
    place = Assignment(node_rank=0, nnodes=3, ranks_per_node=(2, 1, 2), hosts=("a", "b", "c"),
                       master_addr="a", master_port=1, nodes=("ida", "idb", "idc"))
    assert place.nodes_of([2, 4]) == ("idb", "idc")
    assert place.nodes_of([0, 1]) == ("ida",)
    assert elastic.eviction(place, {"never_entered": [2], "call": "all_reduce #12"}) == {
        "evict": ("idb",), "why": "node evicted: rank 2 never entered all_reduce #12"}
    assert elastic.eviction(place, None) == {}
    assert elastic.eviction(place, {"never_entered": [], "call": "x"}) == {}


def test_an_evicted_node_s_refusal_carries_its_own_exit_code() -> None:
    """Issue 40: an evicted node ends with :data:`~unirank.exitcodes.EVICTED`, not with a
    refusal's 2: the helper's refusal line carries the code, the parent's error keeps it."""
    from unirank.exitcodes import EVICTED
    from unirank.supervisor.rdzv import agent

    evicted = agent._evicted("node evicted: rank 1 never entered all_reduce #6")
    with pytest.raises(ConfigError) as caught:
        assignment_of(to_line(evicted.payload).decode(), where="the helper")
    assert caught.value.exit_code == EVICTED
    assert str(caught.value).startswith("node evicted: rank 1 never entered all_reduce #6 HINT")
    with pytest.raises(ConfigError) as refused:  # any other refusal: the usage code
        assignment_of(to_line(agent.Refusal("no").payload).decode(), where="the helper")
    assert refused.value.exit_code is None
