"""The rendezvous server's connections (:mod:`.server`): what it knows of each peer. No torch;
reads no environment variable."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from unirank.supervisor.rdzv.wire import Lines

__all__ = ["Conn", "plain"]


@dataclass
class Conn:
    """One connection of the server: a node (once it said hello: ``node`` set) or a probe."""

    lines: Lines
    node: str = ""
    name: str = ""
    explicit: str | None = None
    pid: int = 0
    #: where its connection comes from
    peer: str = ""
    seen: float = field(default_factory=time.monotonic)
    opened: float = field(default_factory=time.monotonic)
    #: the round whose members the node holds (it was sent that round, whole or as a change:
    #: :mod:`.change`); -1: none
    known: int = -1
    #: whether the server's loop waits for its socket to take more (:meth:`.wire.Lines.flush`)
    writing: bool = False

    @property
    def addr(self) -> str:
        """Its real address: its ``--local-addr``, else where its connection comes from (never
        a name looked up again)."""
        return self.explicit or self.peer


def plain(addr: str) -> str:
    """An IPv4 peer as IPv4 (a dual-stack socket gives ``::ffff:10.0.0.2``)."""
    return addr[7:] if addr.startswith("::ffff:") and "." in addr else addr
