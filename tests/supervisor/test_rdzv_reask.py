"""A node's first hello, sent on by the endpoint to a server that no longer listens (its node
was lost or replaced and the endpoint has not heard yet: fault seed 108), asks the endpoint
again instead of giving up (unirank.supervisor.rdzv.agent.Node.hello with ``reask``). A fake
endpoint on loopback sends the first hello to a dead port and the second to a real server."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import replace

from _rdzv_wire import SPEC
from unirank.supervisor.listen import open_store_socket
from unirank.supervisor.rdzv.agent import Node
from unirank.supervisor.rdzv.server import Server


def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_first_hello_sent_to_a_gone_server_asks_the_endpoint_again() -> None:
    live = open_store_socket(0)
    live_port = int(live.getsockname()[1])
    Server([live], replace(SPEC, endpoint_port=live_port), "b").start()
    endpoint = socket.create_server(("127.0.0.1", 0))
    hellos: list[str] = []
    targets = [_dead_port(), live_port]

    def serve() -> None:  # each connection: one hello, answered "moved" to the next target
        for port in targets:
            conn, _ = endpoint.accept()
            with conn, conn.makefile("rb") as lines:
                hellos.append(json.loads(lines.readline())["op"])
                conn.sendall(json.dumps({"moved": {"addr": "127.0.0.1", "port": port,
                                                   "name": "b"}}).encode() + b"\n")
                lines.readline()  # until the node leaves this connection

    threading.Thread(target=serve, daemon=True).start()
    spec = replace(SPEC, endpoint_port=int(endpoint.getsockname()[1]), serves_endpoint=False)
    node = Node(spec, "n1", None)
    node.hello(time.monotonic() + 30.0, reask=True)
    assert hellos == ["hello", "hello"]  # the endpoint asked again after the dead server
    assert node.address == ("127.0.0.1", live_port) and node.heard > 0
    endpoint.close()


def test_a_node_that_follows_the_job_elsewhere_points_its_endpoint_there() -> None:
    """The endpoint's server this node runs once followed the job to a server ``x``; the node
    is then sent on (``moved``) to ``b``: from then on the endpoint sends every later hello to
    ``b``, not to ``x`` (which may be gone: fault seed 108's endpoint pointed at a replaced
    server)."""
    endpoint = open_store_socket(0)
    spec = replace(SPEC, endpoint_port=int(endpoint.getsockname()[1]))
    local = Server([endpoint], spec, "n1")
    local.start()
    live = open_store_socket(0)
    live_port = int(live.getsockname()[1])
    Server([live], replace(spec, endpoint_port=live_port), "b").start()
    local.moved = {"job": spec.run_id, "round": 0, "server": "x", "addr": "127.0.0.1",
                   "port": _dead_port(), "name": "x"}
    node = Node(spec, "n1", local)
    node.follow({"server": "b", "addr": "127.0.0.1", "port": live_port, "name": "b"})
    assert node.address == ("127.0.0.1", live_port)
    assert (local.moved["server"], local.moved["port"], local.moved["name"]) == \
        ("b", live_port, "b")
    hello = socket.create_connection(("127.0.0.1", spec.endpoint_port), timeout=10)
    with hello, hello.makefile("rb") as lines:  # a node started again asks the endpoint
        hello.sendall(json.dumps({"op": "hello", "job": spec.run_id, "node": "n9",
                                  "name": "n9", "token": "t"}).encode() + b"\n")
        answer = json.loads(lines.readline())
    assert answer["moved"]["port"] == live_port, answer
