"""What a peer sends cannot hurt the rendezvous's server: each bad input closes that
connection only, with one line in the rendezvous's log, and the job's nodes are served on. A
real server (a thread) on a loopback socket, connections driven by hand."""

from __future__ import annotations

import selectors
import socket

import pytest

from _rdzv_wire import RECORD, serve_round_zero, until
from unirank.supervisor.rdzv.messages import MAX_LINE_IN
from unirank.supervisor.rdzv.wire import Lines


def _closed_within(sock: socket.socket, timeout: float = 30.0) -> bool:
    """Whether the server closed ``sock`` (its end read) within ``timeout`` s."""
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ)
        while selector.select(timeout):
            try:
                if sock.recv(65536) == b"":
                    return True
            except ConnectionResetError:
                return True
    return False


@pytest.fixture
def port() -> int:
    """A server of job ``none`` that ran round 0 with nodes a and b."""
    return serve_round_zero()


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30)


BAD = [
    b"this is not json\n",
    b"[1, 2, 3]\n",
    b'{"op": "hello", "job": "none", "node": "x", "pid": "not a number"}\n',
    b'{"op": "evict", "nodes": ["a", "b"], "why": "made up"}\n',
    b'{"op": "join", "record": {"addr": "1.2.3.4"}}\n',
    b'{"op": "teleport"}\n',
]


@pytest.mark.parametrize("payload", BAD, ids=range(len(BAD)))
def test_a_bad_message_closes_its_connection_and_the_server_serves_on(
        port: int, payload: bytes, capfd: pytest.CaptureFixture[str]) -> None:
    bad = _connect(port)
    bad.sendall(payload)
    assert _closed_within(bad)
    assert "unirank rdzv: closed the connection of " in capfd.readouterr().err
    node = Lines(_connect(port))
    node.send({"op": "hello", "job": "none", "node": "b", "name": "b", "pid": 2, "round": 0})
    assert until(node, "ok")["members"] == ["a", "b"]
    node.close()


def test_a_line_longer_than_the_limit_is_cut_off(port: int) -> None:
    bad = _connect(port)
    chunk = b"x" * 65536
    with pytest.raises(OSError):  # the server closes it long before the end
        for _ in range(MAX_LINE_IN // len(chunk) + 64):
            bad.sendall(chunk)
    assert _closed_within(bad)


def test_an_eviction_from_a_node_outside_the_running_round_is_refused(port: int) -> None:
    outsider = Lines(_connect(port))
    outsider.send({"op": "hello", "job": "none", "node": "x", "name": "x", "pid": 3})
    until(outsider, "ok")
    member = Lines(_connect(port))
    member.send({"op": "hello", "job": "none", "node": "b", "name": "b", "pid": 2, "round": 0})
    until(member, "ok")
    outsider.send({"op": "evict", "nodes": ["b"], "why": "made up"})
    assert _closed_within(outsider.sock)
    member.send({"op": "beat"})
    assert "beat" in until(member, "beat")  # b is still served, not evicted


def test_a_redirect_naming_an_address_the_server_does_not_know_is_not_followed(
        port: int) -> None:
    node = Lines(_connect(port))
    node.send({"op": "hello", "job": "none", "node": "b", "name": "b", "pid": 2, "round": 0})
    until(node, "ok")
    probe = Lines(_connect(port))
    probe.send({"op": "redirect", "job": "none", "round": 9, "server": "b", "place": 0,
                "addr": "192.0.2.1", "port": 9, "name": "evil"})
    assert until(probe, "here")["here"]["server"] == "a"
    for _ in range(2):  # a probe is answered at once: a beat or two later, still served here
        until(node, "beat")
    node.send({"op": "beat"})
    later = Lines(_connect(port))
    later.send({"op": "hello", "job": "none", "node": "c", "name": "c", "pid": 4})
    assert "moved" not in until(later, "ok")


@pytest.mark.parametrize(("source", "rdzv_port", "followed"), [
    ("127.0.0.1", RECORD["rdzv_port"], True),  # b's own place, from where b connects
    ("127.0.0.1", 9, False),  # another port at b's address
    ("127.0.0.2", RECORD["rdzv_port"], False),  # b's place, probed from another address
], ids=["member", "other-port", "other-source"])
def test_a_redirect_is_followed_only_to_a_member_s_own_place_from_its_own_address(
        port: int, source: str, rdzv_port: object, followed: bool) -> None:
    """Without a secret, a probe that names member b is followed only where it names b's
    address and rendezvous port as b joined with them, and comes from the address b's own
    connection comes from (anyone who said hello learns b's name and place)."""
    node = Lines(_connect(port))
    node.send({"op": "hello", "job": "none", "node": "b", "name": "b", "pid": 2, "round": 0,
               "token": "b"})
    until(node, "ok")
    probe = Lines(socket.create_connection(("127.0.0.1", port), timeout=30,
                                           source_address=(source, 0)))
    probe.send({"op": "redirect", "job": "none", "round": 9, "server": "b", "place": 0,
                "addr": RECORD["addr"], "port": rdzv_port, "name": "b"})
    until(probe, "here")
    later = Lines(_connect(port))
    later.send({"op": "hello", "job": "none", "node": "c", "name": "c", "pid": 4})
    assert ("moved" in until(later, "ok" if not followed else "moved")) is followed


def test_a_connection_that_says_no_hello_is_closed(port: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """(The limit, 10 s, shortened here so the test does not wait it out.)"""
    import unirank.supervisor.rdzv.server as server

    monkeypatch.setattr(server, "HELLO_WITHIN", 0.5)
    silent = _connect(port)
    assert _closed_within(silent)
