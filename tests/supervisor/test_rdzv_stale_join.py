"""A round closes on what every waiting node said last (fault seed 157): a server that stalled
after reading two nodes' joins (frozen 5.9 s) holds, unread, their ``abandon`` and their
connections' end (they went to a successor meanwhile); the round must not close with them.
A real :class:`~unirank.supervisor.rdzv.server.Server` on loopback, its loop driven by hand
(its thread is not started: the test decides what it has read)."""

from __future__ import annotations

import socket
import time
from dataclasses import replace

from _rdzv_wire import RECORD, SPEC
from unirank.supervisor.listen import open_store_socket
from unirank.supervisor.rdzv.conns import Conn
from unirank.supervisor.rdzv.server import Resume, Server
from unirank.supervisor.rdzv.wire import Lines


def _joined(server: Server, listening: socket.socket, port: int, node: str) -> Lines:
    """A connection of ``node`` whose hello and join the server has read."""
    lines = Lines(socket.create_connection(("127.0.0.1", port), timeout=5))
    server._accept(listening)
    [conn] = [c for c in server._conns.all() if not c.node]
    lines.send({"op": "hello", "job": SPEC.run_id, "node": node, "name": node,
                "explicit": None, "pid": 1, "token": node})
    _read_all(server, conn)
    lines.send({"op": "join", "record": {**RECORD, "claim": node, "name": node}})
    _read_all(server, conn)
    assert conn.node == node
    return lines


def _read_all(server: Server, conn: Conn) -> None:
    deadline = time.monotonic() + 10
    while not conn.lines.waiting():  # the bytes cross loopback: a bounded poll
        assert time.monotonic() < deadline
        time.sleep(0.001)
    server._read(conn)


def _server() -> tuple[Server, socket.socket, int]:
    listening = open_store_socket(0)
    port = int(listening.getsockname()[1])
    spec = replace(SPEC, endpoint_port=port, min_nodes=2, max_nodes=4, last_call_timeout=0.0)
    records = {n: {**RECORD, "claim": n, "name": n} for n in "abc"}
    return Server([listening], spec, "a", Resume(0, ("a", "b", "c"), records, frozenset())), \
        listening, port


def _later(server: Server) -> float:
    """A moment past the close timeout: node a (this server's own, in no round yet) no longer
    holds the round open."""
    return time.monotonic() + server.spec.close_timeout + 1


def test_a_round_never_closes_on_joins_whose_nodes_left_since_unread() -> None:
    server, listening, port = _server()
    b, c = (_joined(server, listening, port, n) for n in "bc")
    for lines in (b, c):  # each gave this server up and went to a successor
        lines.send({"op": "abandon"})
        lines.close()
    for name in "bc":  # what they sent since is there to read, not read yet
        conn = server._conns.named[name]
        deadline = time.monotonic() + 10
        while not conn.lines.waiting():
            assert time.monotonic() < deadline
            time.sleep(0.001)
    server._maybe_close(_later(server))
    assert server.round == 0 and not server._waiting  # no round of nodes that left


def test_the_round_closes_where_the_waiting_nodes_said_nothing_since() -> None:
    server, listening, port = _server()
    b, c = (_joined(server, listening, port, n) for n in "bc")
    server._maybe_close(_later(server))
    assert server.round == 1 and set(server.members) == {"b", "c"}
    b.close()
    c.close()
