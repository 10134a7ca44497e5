"""A successor's server probes the original endpoint and redirects a fresh server of the same
job found there (:func:`unirank.supervisor.rdzv.rounds.follows`): real servers (threads) on
loopback sockets, a node's connection driven by hand."""

from __future__ import annotations

import socket
from dataclasses import replace
from typing import Any

from _rdzv_wire import until
from unirank.supervisor.listen import open_store_socket
from unirank.supervisor.rdzv.server import Resume, Server
from unirank.supervisor.rdzv.spec import RdzvSpec
from unirank.supervisor.rdzv.wire import Lines

SPEC = RdzvSpec(endpoint_host="127.0.0.1", endpoint_port=0, run_id="j", min_nodes=1,
                max_nodes=2, local_addr="127.0.0.1", node_name="n", nproc=1,
                serves_endpoint=True)


def _hello(port: int, node: str) -> Lines:
    lines = Lines(socket.create_connection(("127.0.0.1", port), timeout=5))
    lines.send({"op": "hello", "job": "j", "node": node, "name": node, "explicit": None,
                "pid": 1})
    return lines


def _servers(job: str = "j") -> tuple[int, int]:
    """A fresh server at the endpoint and a successor of job ``job`` that ran on (round 1);
    their ports."""
    endpoint = open_store_socket(0)
    spec = replace(SPEC, endpoint_port=int(endpoint.getsockname()[1]))
    Server([endpoint], spec, "fresh").start()
    spare = open_store_socket(0)
    record = {"addr": "127.0.0.1", "rdzv_port": int(spare.getsockname()[1]), "name": "b",
              "nproc": 1, "store_port": 0, "serves_endpoint": False, "claim": "b"}
    Server([spare], replace(spec, run_id=job), "b",
           Resume(1, ("a", "b"), {"a": record, "b": record}, frozenset({"a"}))).start()
    return spec.endpoint_port, record["rdzv_port"]


def test_a_fresh_server_at_the_endpoint_sends_its_nodes_to_the_job_that_ran_on() -> None:
    endpoint, successor = _servers()
    node = _hello(endpoint, "a2")
    # sent on whether the probe came before its hello (then the answer) or after (then news)
    moved = until(node, "moved")["moved"]
    assert (moved["addr"], moved["port"], moved["server"]) == ("127.0.0.1", successor, "b")
    # a later node started with the original command is sent there at its hello
    later = _hello(endpoint, "c")
    assert until(later, "moved")["moved"]["port"] == successor
    # and the successor answers with the last round, so the node can follow it further
    there = _hello(successor, "a2")
    answer = until(there, "ok")
    assert (answer["members"], answer["server"]) == (["a", "b"], "b")
    for lines in (node, later, there):
        lines.close()


def test_a_server_of_another_job_is_not_redirected() -> None:
    endpoint, _successor = _servers(job="other")
    node = _hello(endpoint, "a2")
    assert until(node, "ok")["round"] == -1
    # the probe comes once per beat interval (1 s): two beats from the fresh server, no move
    for _ in range(2):
        until(node, "beat")
    node.send({"op": "beat"})
    node.close()


def test_a_node_that_took_part_in_a_later_round_is_refused_by_a_server_behind_it() -> None:
    """A server of a side that lost the job (here at round 1) never counts a node that took
    part in round 2 (a quorum over round 1 would not meet round 2's): it answers ``behind``."""
    _endpoint, successor = _servers()
    ahead = Lines(socket.create_connection(("127.0.0.1", successor), timeout=5))
    ahead.send({"op": "hello", "job": "j", "node": "a", "name": "a", "explicit": None,
                "pid": 1, "round": 2})
    assert until(ahead, "behind")["behind"] == 1
    same = Lines(socket.create_connection(("127.0.0.1", successor), timeout=5))
    same.send({"op": "hello", "job": "j", "node": "a", "name": "a", "explicit": None,
               "pid": 1, "round": 1})
    assert until(same, "ok")["round"] == 1
    for lines in (ahead, same):
        lines.close()


def test_a_probe_whose_prober_left_is_not_followed() -> None:
    """A probe that waited in the queue of a node's rendezvous port while nothing served it
    (its prober, a successor since lost, gave up waiting and closed) is stale: the node that
    then serves there does not send its nodes to the address in it."""
    spare = open_store_socket(0)
    port = int(spare.getsockname()[1])
    stale = socket.create_connection(("127.0.0.1", port), timeout=5)
    Lines(stale).send({"op": "redirect", "job": "j", "round": 1, "server": "a", "place": 0,
                       "addr": "127.0.0.1", "port": 9, "name": "a"})
    stale.close()
    record = {"addr": "127.0.0.1", "rdzv_port": port, "name": "b", "nproc": 1,
              "store_port": 0, "serves_endpoint": False, "claim": "b"}
    spec = replace(SPEC, endpoint_port=9)
    Server([spare], spec, "b",
           Resume(1, ("a", "b"), {"a": {**record, "rdzv_port": 9, "claim": "a"}, "b": record},
                  frozenset({"a"}))).start()
    node = _hello(port, "c")
    answer = until(node, "ok")  # the stale probe was read before this hello (one queue)
    assert answer["server"] == "b"
    live = socket.create_connection(("127.0.0.1", port), timeout=5)
    probe = Lines(live)
    probe.send({"op": "redirect", "job": "j", "round": 1, "server": "a", "place": 0,
                "addr": "127.0.0.1", "port": 9, "name": "a"})
    assert until(probe, "here")["here"]["server"] == "b"
    assert until(node, "moved")["moved"]["server"] == "a"  # a live prober is followed
    for lines in (node, probe):
        lines.close()


def test_a_successor_probes_the_endpoint_and_the_members_not_connected_to_it() -> None:
    """A member connected to this server serves no other side: at thousands of nodes, all
    connected, the probe goes to the endpoint only (each port probed where nothing serves holds
    the probe up to a beat interval); the others in the round's order, this node's own never."""
    from unirank.supervisor.rdzv.probe import targets

    records = {m: {"addr": f"10.0.0.{i}", "rdzv_port": 7000 + i}
               for i, m in enumerate(("s", "a", "b", "c"))}
    spec = replace(SPEC, endpoint_host="node0", endpoint_port=29400)
    members = ("s", "a", "b", "c")
    assert targets(spec, "s", members, records, {"s", "a", "b", "c"}) == [("node0", 29400)]
    assert targets(spec, "s", members, records, {"s", "b"}) == [
        ("node0", 29400), ("10.0.0.1", 7001), ("10.0.0.3", 7003)]


def test_a_successor_never_follows_a_server_it_proved_dead_named_second_hand() -> None:
    """The fault sweep's seed 51: the endpoint's server had followed the serving node, which
    was then killed; its successor's probe of the endpoint heard that dead node's place (same
    round, earlier in the order) and sent every node there, where nothing answered: the job
    ended. A successor never follows a node it proved dead. Staged with a stand-in endpoint
    that answers each probe with the dead node's place: the successor probes again (it did
    not follow) and its node is told nothing."""
    endpoint = open_store_socket(0)
    spare = open_store_socket(0)
    record = {"addr": "127.0.0.1", "rdzv_port": int(spare.getsockname()[1]), "name": "b",
              "nproc": 1, "store_port": 0, "serves_endpoint": False, "claim": "b"}
    dead_place = {"job": "j", "round": 1, "server": "a", "place": 0, "addr": "127.0.0.1",
                  "port": 9, "name": "a"}
    spec = replace(SPEC, endpoint_port=int(endpoint.getsockname()[1]))
    Server([spare], spec, "b",
           Resume(1, ("a", "b"), {"a": {**record, "rdzv_port": 9, "claim": "a"}, "b": record},
                  frozenset({"a"}), frozenset({"a"}))).start()
    node = _hello(record["rdzv_port"], "c")
    assert until(node, "ok")["server"] == "b"
    endpoint.settimeout(30)
    for _ in range(2):  # a successor that followed would probe no more
        probe, _address = endpoint.accept()
        with probe:
            lines = Lines(probe)
            assert until(lines, "op")["op"] == "redirect"
            lines.send({"here": dead_place})
    node.sock.setblocking(False)
    pending = node.receive() or []
    assert not any("moved" in message for message in pending), pending
    node.close()
    endpoint.close()


def test_a_hello_whose_sender_left_proves_nothing() -> None:
    """The fault sweep's seed 151 (two worlds of 2 for 56 s): the serving node was frozen; the
    other nodes, hearing nothing, each tried it once more (a hello on a new connection, closed
    unanswered after a beat) and went to a successor. The frozen server, resumed, read those
    hellos and then their connections' end, and took both nodes for dead: alone with a
    newcomer it held a "majority" and trained beside the successor's world. A hello whose
    sender already closed its side is stale: not answered, and it proves nothing (as a stale
    probe). Staged with member b's hello sent and its side shut before the server reads it:
    the server closes the connection unanswered, and b is not taken for dead."""
    spare = open_store_socket(0)
    port = int(spare.getsockname()[1])
    stale = socket.create_connection(("127.0.0.1", port), timeout=30)
    Lines(stale).send({"op": "hello", "job": "j", "node": "b", "name": "b", "explicit": None,
                       "pid": 2, "round": 1})
    stale.shutdown(socket.SHUT_WR)
    record = {"addr": "127.0.0.1", "rdzv_port": port, "name": "a", "nproc": 1,
              "store_port": 0, "serves_endpoint": False, "claim": "a"}
    records = {n: {**record, "name": n, "claim": n} for n in "abc"}
    server = Server([spare], replace(SPEC, endpoint_port=9, max_nodes=3), "a",
                    Resume(1, ("a", "b", "c"), records, frozenset({"c"})))
    server.start()
    assert stale.recv(65536) == b""  # closed unanswered (it was answered "ok" before)
    stale.close()
    assert server.proven_dead() == frozenset()


def _refusing_port() -> int:
    """A loopback port nothing listens on (a socket bound, then closed: connects are refused)."""
    sock = open_store_socket(0)
    port = int(sock.getsockname()[1])
    sock.close()
    return port


def _beating_until(lines: Lines, key: str, timeout: float = 30.0) -> dict[str, Any]:
    """The first message holding ``key`` on ``lines``, beating every half second meanwhile as a
    node does (fails after ``timeout`` s)."""
    import selectors
    import time

    deadline = time.monotonic() + timeout  # a bound for a failure, not a measure
    with selectors.DefaultSelector() as selector:
        selector.register(lines.sock, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(0.5):
                lines.send({"op": "beat"})
                continue
            messages = lines.receive()
            assert messages is not None, f"closed before {key!r}"
            found = [m for m in messages if key in m]
            if found:
                return found[0]
    raise AssertionError(f"no {key!r} within {timeout:g} s")


def _successor_of_three(c_port: int) -> tuple[Server, int]:
    """Node b's successor after round 1 of nodes a, b, c (a, which served it, proven dead); c's
    rendezvous port is ``c_port``; the server and its port."""
    spare = open_store_socket(0)
    port = int(spare.getsockname()[1])
    record = {"addr": "127.0.0.1", "rdzv_port": port, "name": "b", "nproc": 1,
              "store_port": 0, "serves_endpoint": False, "claim": "b"}
    records = {"a": {**record, "rdzv_port": _refusing_port(), "claim": "a"}, "b": record,
               "c": {**record, "rdzv_port": c_port, "claim": "c"}}
    server = Server([spare], replace(SPEC, endpoint_port=_refusing_port(), max_nodes=3), "b",
                    Resume(1, ("a", "b", "c"), records, frozenset({"a"}), frozenset({"a"})))
    server.start()
    return server, port


def test_a_member_whose_rendezvous_port_refuses_is_proven_dead_and_not_waited_for() -> None:
    """Fault seed 14: the serving node and node c killed at once. The successor (b) probes c's
    rendezvous port, which refuses (its helper is gone): c is proven dead, so the round after
    closes with b at once; before, c counted alive for the successor's whole grace (11 s),
    long enough for the next fault to find no world."""
    server, port = _successor_of_three(_refusing_port())
    node = _hello(port, "b")
    until(node, "ok")
    node.send({"op": "join", "record": {"addr": "127.0.0.1", "rdzv_port": port, "name": "b",
                                        "nproc": 1, "store_port": 0,
                                        "serves_endpoint": False, "claim": "b"}})
    closed = _beating_until(node, "round")
    assert closed["round"] == 2
    assert "c" in server.proven_dead()
    node.close()


def test_a_member_whose_rendezvous_port_accepts_is_not_proven_dead() -> None:
    """A member alive but not serving (its helper holds its port: the kernel accepts, nothing
    answers) proves nothing: the successor's probe gives up on it after a beat, again each
    beat, and never counts it dead."""
    alive = open_store_socket(0)
    server, _port = _successor_of_three(int(alive.getsockname()[1]))
    alive.settimeout(30)
    for _ in range(2):  # the second probe comes after the first gave up
        probe, _peer = alive.accept()
        probe.close()
    assert "c" not in server.proven_dead()
    alive.close()
