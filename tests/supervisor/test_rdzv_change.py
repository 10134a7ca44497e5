"""A round sent as a change against the round before (:mod:`unirank.supervisor.rdzv.change`):
pure rules, then a real server (a thread on loopback) sending it, and its news once per round."""

from __future__ import annotations

import json
import selectors
import socket
from collections import deque
from dataclasses import replace
from typing import Any

import pytest

from _rdzv_wire import RECORD, SPEC
from unirank.supervisor.listen import open_store_socket
from unirank.supervisor.rdzv.change import (
    BadChange,
    change_of,
    digest,
    full_round,
    read_round,
)
from unirank.supervisor.rdzv.rounds import members_of, rebuilt
from unirank.supervisor.rdzv.server import Server
from unirank.supervisor.rdzv.wire import Lines


def _records(*names: str, port: int = 0) -> dict[str, dict[str, object]]:
    return {n: {**RECORD, "claim": n, "name": n, "store_port": port} for n in names}


def test_a_lost_node_is_sent_as_one_name_and_rebuilds_the_round() -> None:
    before = ("s", "a", "b", "c")
    records = _records(*before)
    after = members_of(before, ("a", "s", "c"), frozenset(before), 8, "s")
    change = change_of(4, before, records, after, records, "s")
    assert change == {"round": 4, "after": 3, "base": digest(before), "gone": ["b"],
                      "came": [], "changed": {}, "server": "s", "size": 3}
    assert read_round(change, 3, before, records) == (after, {m: records[m] for m in after})


def test_new_nodes_and_a_changed_record_travel_and_the_serving_node_goes_first() -> None:
    """A successor's first round puts it first (:func:`members_of`); a node that came, and
    one whose record differs, bring their records; the others' stay as held."""
    before = ("old", "a", "b")
    held = _records(*before)
    now = {**held, "b": {**held["b"], "store_port": 9}, **_records("d")}
    after = members_of(before, ("b", "d", "a"), frozenset(("a", "b", "d")), 8, "b")
    assert after == ("b", "a", "d")
    change = change_of(1, before, held, after, now, "b")
    assert change is not None
    assert change["gone"] == ["old"] and change["came"] == ["d"]
    assert set(change["changed"]) == {"b", "d"}
    assert read_round(change, 0, before, held) == (after, {m: now[m] for m in after})


def test_an_order_the_rule_does_not_give_goes_whole() -> None:
    before = ("a", "b", "c")
    records = _records(*before)
    assert change_of(1, before, records, ("a", "c", "b"), records, "a") is None
    assert rebuilt(before, ["b"], ["d"], "d") == ("d", "a", "c")


def test_a_change_against_another_round_is_refused_not_guessed() -> None:
    before = ("a", "b")
    records = _records(*before)
    change = change_of(5, before, records, ("a",), records, "a")
    assert change is not None
    with pytest.raises(BadChange, match="change against round 4, and this node holds round 3"):
        read_round(change, 3, before, records)
    with pytest.raises(BadChange, match="does not rebuild"):
        read_round({**change, "size": 2}, 4, before, records)
    with pytest.raises(BadChange, match="this node holds another 4"):  # same number, other order
        read_round(change, 4, ("b", "a"), records)


def test_a_whole_round_reads_as_it_always_did() -> None:
    records = _records("a", "b")
    message = json.loads(json.dumps(full_round(0, ("a", "b"), records, "a")))
    assert read_round(message, -1, (), {}) == (("a", "b"), records)


# -- a real server -------------------------------------------------------------------------

class _Node:
    """A node driven by hand: every message it got, in order, none dropped."""

    def __init__(self, port: int, name: str, known: int = -1, *, hello: bool = True) -> None:
        self.name, self.seen = name, deque[dict[str, Any]]()
        self.lines = Lines(socket.create_connection(("127.0.0.1", port), timeout=10))
        if hello:
            self.lines.send({"op": "hello", "job": "none", "node": name, "token": name,
                             "round": known, "known": known})
            self.ok = self.next("ok")

    def next(self, key: str, timeout: float = 30.0) -> dict[str, Any]:
        """The next message (all before it are skipped); it must hold ``key``."""
        with selectors.DefaultSelector() as selector:
            selector.register(self.lines.sock, selectors.EVENT_READ)
            while not self.seen:
                assert selector.select(timeout), f"{self.name}: no {key!r} in {timeout:g} s"
                messages = self.lines.receive()
                assert messages is not None, f"{self.name}: closed before {key!r}"
                self.seen.extend(m for m in messages if "beat" not in m)
        message = self.seen.popleft()
        assert key in message, message
        return message

    def join(self) -> None:
        self.lines.send({"op": "join", "record": {**RECORD, "claim": self.name,
                                                  "name": self.name}})


def test_a_server_sends_a_loss_as_a_change_and_tells_each_member_once() -> None:
    """Three nodes in round 0; one is lost and a survivor asks for a new round: the other
    survivor hears one piece of news (not one per join), and both get round 1 as a change
    naming the lost node only. A node new to the job that joins it later gets the round
    whole, and the hello's answer names the members only to a node that does not hold
    them."""
    listening = open_store_socket(0)
    spec = replace(SPEC, endpoint_port=int(listening.getsockname()[1]), min_nodes=2,
                   max_nodes=3, last_call_timeout=600.0, close_timeout=600.0)  # closes at 3
    Server([listening], spec, "a").start()
    port = spec.endpoint_port
    nodes = {name: _Node(port, name) for name in ("a", "b", "c")}
    for node in nodes.values():
        node.join()
    for node in nodes.values():  # the serving node first, then in the order they joined
        members = node.next("round")["members"]
        assert members[0] == "a" and sorted(members) == ["a", "b", "c"]
    nodes.pop("c").lines.close()  # lost: its connection ended
    for node in nodes.values():
        assert node.next("event")["kind"] == "lost"
    nodes["a"].join()  # news for b would be "a asked for a new round": b was told already
    nodes["b"].join()
    for node in nodes.values():
        message = node.next("round")  # not a second event first
        assert message["after"] == 0 and message["gone"] == ["c"] and "members" not in message
    assert _Node(port, "d").ok["members"] == ["a", "b"]
    again = _Node(port, "e", known=1)
    assert "members" not in again.ok and again.ok["round"] == 1


def test_a_server_connection_never_blocks_on_a_peer_that_stops_reading() -> None:
    """A queued connection (the server's) takes lines past what the kernel holds without
    blocking, says since when nothing went, and sends them whole and in order once the peer
    reads again (a timed-out blocking send once left half a line in the stream)."""
    ours, theirs = socket.socketpair()
    lines = Lines(ours, queued=True)
    line = b'{"round": 1, "pad": "' + b"x" * 65536 + b'"}\n'
    count = 0
    while not lines.pending():  # until the kernel takes no more
        assert lines.send_line(line)
        count += 1
    assert lines.send_line(line)  # queued, not blocked
    count += 1
    assert lines.stalled_for(lines._stalled or 0.0) == 0.0 < lines.stalled_for(1e12)
    got = b""
    theirs.settimeout(30)
    while len(got) < count * len(line):
        got += theirs.recv(1 << 20)
        lines.flush()
    assert got == line * count
    assert not lines.pending() and lines.stalled_for(1e12) == 0.0


def test_a_server_whose_node_succeeded_serves_until_the_others_left() -> None:
    """The serving node's run succeeded (its helper said leave): its server stays until the
    other node left too (``drained``), so that node's workers, ending with the same last
    step, never read its end as a lost server. A node that leaves first does not end it."""
    listening = open_store_socket(0)
    spec = replace(SPEC, endpoint_port=int(listening.getsockname()[1]), min_nodes=2,
                   max_nodes=3, last_call_timeout=600.0, close_timeout=600.0)
    server = Server([listening], spec, "a")
    server.start()
    port = spec.endpoint_port
    a, b, c = (_Node(port, name) for name in ("a", "b", "c"))
    b.lines.send({"op": "leave"})
    a.lines.send({"op": "leave"})
    probe = _Node(port, "probe", hello=False)  # answered after a's leave was read
    probe.lines.send({"op": "redirect", "job": "none", "round": -1, "server": "x"})
    probe.next("here")
    assert not server.drained.is_set()  # c is still there
    c.lines.send({"op": "leave"})
    assert server.drained.wait(30)


def test_members_at_max_hear_how_many_spares_wait_when_it_changes() -> None:
    """The job runs at MAX (2); a third node joins and waits (a spare): each member hears
    ``spares: 1`` and its name (not news: nothing restarts), and ``spares: 0`` once it left."""
    listening = open_store_socket(0)
    spec = replace(SPEC, endpoint_port=int(listening.getsockname()[1]), min_nodes=1,
                   max_nodes=2, last_call_timeout=600.0, close_timeout=600.0)  # closes at 2
    Server([listening], spec, "a").start()
    port = spec.endpoint_port
    nodes = {name: _Node(port, name) for name in ("a", "b")}
    for node in nodes.values():
        node.join()
    for node in nodes.values():
        assert node.next("round")["members"] == ["a", "b"]
    spare = _Node(port, "c")
    spare.join()
    assert spare.next("event")["kind"] == "wait"
    for node in nodes.values():
        assert node.next("spares") == {"spares": 1, "names": ["c"]}
    spare.lines.close()
    for node in nodes.values():
        assert node.next("spares") == {"spares": 0, "names": []}
