"""The rendezvous server's connections (:mod:`.server`): what it knows of each peer, and the
registry that finds them. No torch; reads no environment variable."""

from __future__ import annotations

import contextlib
import selectors
import time
from dataclasses import dataclass, field

from unirank.supervisor.rdzv.wire import Lines

__all__ = ["Conn", "Conns", "plain"]


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


class Conns:
    """The server's connections on its ``selector``: each by descriptor, the nodes (those that
    said hello) by name, those without a hello yet, and where each node's connection came
    from. Thousands of nodes joining at once are never scanned per hello."""

    def __init__(self, selector: selectors.BaseSelector) -> None:
        self.selector = selector
        self._by_fd: dict[int, Conn] = {}
        self.named: dict[str, Conn] = {}
        #: those without a hello, by id (the oldest goes first where too many wait)
        self.unnamed: dict[int, Conn] = {}
        #: node -> the address its connection came from (it outlives the connection)
        self.peers: dict[str, str] = {}

    def all(self) -> list[Conn]:
        """Every connection now (a copy: handling one may close others)."""
        return list(self._by_fd.values())

    def add(self, conn: Conn) -> None:
        self._by_fd[conn.lines.fileno()] = self.unnamed[id(conn)] = conn
        self.selector.register(conn.lines.sock, selectors.EVENT_READ, conn)

    def name(self, conn: Conn, node: str, name: str) -> None:
        """``conn`` said hello as ``node``."""
        self._unname(conn)
        conn.node, conn.name = node, name
        self.named[node] = conn
        self.peers[node] = conn.peer

    def forget(self, conn: Conn) -> None:
        """Close ``conn`` and forget it (once)."""
        if conn.lines.closed:
            return
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(conn.lines.sock)
        self._by_fd.pop(conn.lines.fileno(), None)
        self._unname(conn)
        conn.lines.close()

    def _unname(self, conn: Conn) -> None:
        self.unnamed.pop(id(conn), None)
        if self.named.get(conn.node) is conn:
            del self.named[conn.node]

    def watch_writes(self, conn: Conn) -> None:
        """Wake the selector when ``conn``'s socket takes more of what waits for it, and only
        then."""
        if conn.lines.pending() != conn.writing:
            conn.writing = not conn.writing
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.writing else 0)
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.selector.modify(conn.lines.sock, events, conn)
