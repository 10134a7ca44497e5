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
