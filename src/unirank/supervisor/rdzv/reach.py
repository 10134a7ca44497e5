"""How a rendezvous helper (:mod:`.agent`) reaches the rendezvous: its one-line refusal, its
identity, serving the endpoint where this node is on its host, and connecting (no torch; reads
no environment variable). A connection refused where a helper listened proves that helper gone
(:func:`.rounds.has_quorum`): its ``unirank run`` stops its workers when its helper ends, and
ends with it (the helper's parent-death signal)."""

from __future__ import annotations

import os
import secrets
import socket
import time
from typing import TYPE_CHECKING, Any

from unirank.supervisor.rdzv.spec import RdzvSpec
from unirank.supervisor.rdzv.wire import Lines

if TYPE_CHECKING:
    from unirank.supervisor.rdzv.server import Server

__all__ = [
    "MAX_HOPS",
    "REASK_S",
    "REDIRECT_TRY_S",
    "Refusal",
    "connect",
    "endpoint",
    "endpoint_socket",
    "node_identity",
    "serve_if_endpoint",
]

#: how many ``moved`` answers a hello follows in a row (servers that followed the job's
#: server) before it asks the endpoint again
MAX_HOPS = 8
#: seconds a hello tries a server it was sent on to before it asks the endpoint again, and the
#: pause before it does
REDIRECT_TRY_S = 3.0
REASK_S = 0.5


class Refusal(Exception):
    """This node cannot take part: one line, the option at fault and what to do."""

    def __init__(self, message: str, *, variable: str | None = None,
                 value: str | None = None, hint: str = "", exit_code: int | None = None) -> None:
        super().__init__(message)
        self.payload: dict[str, Any] = {"error": message, "variable": variable, "value": value,
                                        "hint": hint}
        if exit_code is not None:  # the parent's own exit code for it (this node evicted)
            self.payload["exit_code"] = exit_code
        #: the address answered that nothing listens there (its node's helper is gone)
        self.refused = False
        #: the server did not answer, or closed the connection (it may still run)
        self.silent = False


def endpoint(spec: RdzvSpec) -> str:
    return f"{spec.endpoint_host}:{spec.endpoint_port}"


def node_identity() -> str:
    """This node's identity in the rendezvous: host, the ``unirank run`` parent's pid and a
    random part (as torchrun's agents: several on one host are several nodes)."""
    return f"{socket.gethostname()}:{os.getppid()}:{secrets.token_hex(4)}"


def serve_if_endpoint(spec: RdzvSpec, host: str) -> Server | None:
    """Serve the rendezvous here where this node is on the endpoint's host and the port is free;
    the server, or None (``host``: this node's identity)."""
    listening = endpoint_socket(spec)
    if listening is None:
        return None
    from unirank.supervisor.rdzv.server import Server

    server = Server([listening], spec, host)
    server.start()
    return server


def endpoint_socket(spec: RdzvSpec) -> socket.socket | None:
    """The endpoint's port, listening, where this node is on its host and it is free."""
    if not spec.serves_endpoint:
        return None
    from unirank.errors import ConfigError
    from unirank.supervisor.listen import open_store_socket

    try:
        return open_store_socket(spec.endpoint_port, host=spec.endpoint_host,
                                 option="--rdzv-endpoint")
    except ConfigError:
        return None  # in use: another node of this host serves it


def connect(spec: RdzvSpec, address: tuple[str, int], deadline: float, *,
            refused_ends: bool = False) -> Lines:
    """A connection to the rendezvous at ``address``, tried until ``deadline`` (the endpoint's
    node may start after this one); ``refused_ends``: a refusal ends the tries at once (an
    address where a helper listened: it is gone)."""
    while True:
        try:
            return Lines(socket.create_connection(address, timeout=2))
        except OSError as exc:
            refused = isinstance(exc, ConnectionRefusedError)
            if time.monotonic() >= deadline or (refused and refused_ends):
                refusal = Refusal(
                    f"nothing serves the rendezvous at {address[0]}:{address[1]}",
                    variable="--rdzv-endpoint", value=endpoint(spec),
                    hint="start unirank run on the endpoint's host too (its node serves the "
                    "rendezvous), or give --rdzv-endpoint one of the nodes' addresses")
                refusal.refused = refused
                refusal.silent = not refused
                raise refusal from None
            time.sleep(0.2)
