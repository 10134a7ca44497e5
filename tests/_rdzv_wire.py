"""What the rendezvous server's tests share: a real server (a thread) on a loopback socket, and
reading its answers from a connection driven by hand."""

from __future__ import annotations

import selectors
from dataclasses import replace
from typing import Any

from unirank.supervisor.listen import open_store_socket
from unirank.supervisor.rdzv.server import Resume, Server
from unirank.supervisor.rdzv.spec import RdzvSpec
from unirank.supervisor.rdzv.wire import Lines

__all__ = ["RECORD", "SPEC", "serve_round_zero", "until"]

SPEC = RdzvSpec(endpoint_host="127.0.0.1", endpoint_port=0, run_id="none", min_nodes=1,
                max_nodes=2, local_addr="127.0.0.1", node_name="n", nproc=1,
                serves_endpoint=True)
RECORD = {"addr": "127.0.0.1", "rdzv_port": 1, "name": "a", "nproc": 1, "store_port": 0,
          "serves_endpoint": True, "claim": "a"}


def until(lines: Lines, key: str, timeout: float = 30.0) -> dict[str, Any]:
    """The first message holding ``key`` on ``lines`` (fails after ``timeout`` s)."""
    with selectors.DefaultSelector() as selector:
        selector.register(lines.sock, selectors.EVENT_READ)
        while True:
            assert selector.select(timeout), f"no {key!r} within {timeout:g} s"
            messages = lines.receive()
            assert messages is not None, f"closed before {key!r}"
            found = [m for m in messages if key in m]
            if found:
                return found[0]


def serve_round_zero(spec: RdzvSpec = SPEC) -> int:
    """A server of ``spec``'s job that ran round 0 with nodes a and b (its node: a); its
    port."""
    listening = open_store_socket(0)
    spec = replace(spec, endpoint_port=int(listening.getsockname()[1]))
    Server([listening], spec, "a",
           Resume(0, ("a", "b"), {"a": RECORD, "b": {**RECORD, "claim": "b"}},
                  frozenset())).start()
    return spec.endpoint_port
