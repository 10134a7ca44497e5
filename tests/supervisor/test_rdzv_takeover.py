"""A node that takes the rendezvous over (its server's successor) more than once, and what the
endpoint's server it runs then tells others (unirank.supervisor.rdzv.agent.Node._take_over,
``_point_local``): real servers (threads) on loopback sockets. Fault seeds 160 and 168: a node
cut off twice ran two servers on its one rendezvous port (the first had followed the job since
and answered ``moved`` to that very port), and the endpoint's pointer named the successor first
of its round, so two servers each followed the other."""

from __future__ import annotations

import selectors
import socket
from dataclasses import replace
from typing import Any

from _rdzv_wire import SPEC
from unirank.supervisor.listen import open_store_socket
from unirank.supervisor.rdzv.agent import Node
from unirank.supervisor.rdzv.server import Server
from unirank.supervisor.rdzv.wire import Lines


def _node_after_round_3() -> tuple[Node, Server, dict[str, Any]]:
    """Node n1, which serves the endpoint, after round 3 of nodes n2 (which served it) and n1;
    the node, its endpoint's server (which followed the job to n2 once) and n1's record."""
    endpoint = open_store_socket(0)
    spec = replace(SPEC, endpoint_port=int(endpoint.getsockname()[1]), max_nodes=3)
    local = Server([endpoint], spec, "n1")
    local.start()
    node = Node(spec, "n1", local)
    record = {"addr": "127.0.0.1", "rdzv_port": int(node.spare.getsockname()[1]),
              "name": "n1", "nproc": 1, "store_port": 0, "serves_endpoint": True,
              "claim": "n1"}
    node.round, node.known, node.server = 3, 3, "n2"
    node.members = ("n2", "n1")
    node.records = {"n2": {**record, "rdzv_port": 9, "name": "n2", "claim": "n2",
                           "serves_endpoint": False}, "n1": record}
    local.moved = {"job": spec.run_id, "round": 3, "place": 0, "server": "n2",
                   "addr": "127.0.0.1", "port": 9, "name": "n2"}
    return node, local, record


def _answer(port: int, who: str) -> dict[str, Any]:
    """The first answer, not a beat, to a hello of node ``who`` at ``port``."""
    lines = Lines(socket.create_connection(("127.0.0.1", port), timeout=10))
    lines.send({"op": "hello", "job": SPEC.run_id, "node": who, "name": who,
                "explicit": None, "pid": 1, "token": who})
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(lines.sock, selectors.EVENT_READ)
            while True:
                assert selector.select(10), f"no answer to {who}'s hello"
                messages = lines.receive()
                assert messages is not None, f"closed before an answer to {who}"
                answers = [m for m in messages if "beat" not in m]
                if answers:
                    return answers[0]
    finally:
        lines.close()


def test_a_second_take_over_leaves_one_server_on_the_node_s_port() -> None:
    node, _local, record = _node_after_round_3()
    gone = frozenset({"n2"})
    node._take_over(gone, gone, record)
    first = node.local
    assert first is not None
    first.moved = {"job": SPEC.run_id, "round": 3, "place": 0, "server": "n2",
                   "addr": "127.0.0.1", "port": 9, "name": "n2"}  # it followed the job since
    node._take_over(gone, gone, record)  # cut off again: the node serves again
    port = int(record["rdzv_port"])
    assert [s for s in node.locals if node.spare in s.listening] == [node.local]
    assert node.local is not first
    for number in range(12):  # each hello at the port meets the new server, none "moved"
        answer = _answer(port, f"x{number}")
        assert answer.get("ok") and answer["server"] == "n1", answer


def test_the_endpoint_names_a_successor_at_its_own_round_and_place() -> None:
    """n1 (second in round 3's order) takes over: the endpoint's server now sends nodes to n1's
    server and says where it stands as that server does (round 3, place 1), so n2's server
    (place 0) never follows it while it follows n2's."""
    node, local, record = _node_after_round_3()
    node._take_over(frozenset({"n2"}), frozenset({"n2"}), record)
    successor = node.local
    assert successor is not None and local.moved is not None
    here = successor.here()
    assert (local.moved["server"], local.moved["round"], local.moved["place"]) == \
        ("n1", here["round"], here["place"]) == ("n1", 3, 1)
