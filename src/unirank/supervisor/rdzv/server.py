"""The rendezvous store's server: a thread of the helper of the node that serves the endpoint
(:mod:`.agent`). No torch; reads no environment variable.

It holds the job's small state (its ``--rdzv-id``, the round, the members and their records)
and keeps one connection per node (:mod:`.wire`). A node is any ``unirank run``: several on one
host are several nodes (each helper names itself: host, pid and a random part). A node whose
connection closes without a word (its processes died: the kernel closes their sockets) is lost
at once and *proven dead*, as one that said ``leave`` or was evicted; one silent for
:func:`.conf.lost_after` (a hung machine, a cut network) is lost then and told ``dropped``
(should it hear it, it comes back as a new node); one that says ``abandon`` (it heard nothing
from this server for :func:`.conf.fence_after`) is lost: neither is proven dead. The members
of the running round are told (one ``event``) when one of them is lost, asks for a new round,
or when a new node waits to join. Rounds close by :func:`.rounds.round_closes`, under its
quorum over the nodes of the round before not proven dead (:func:`.rounds.has_quorum`).

A successor (a server resumed from the last round) probes the original endpoint and the other
members' rendezvous ports once per beat interval: a server of the job found there at an
earlier round follows it, one at a later round is followed (:func:`.rounds.follows`; the probe
is answered with ``here``); a server that followed answers ``moved`` to its nodes and to every
later hello. A successor not told that the server before it died (its address refused) waits
``hold`` seconds before its first round: the other side of a split, cut off but alive, has then
declared this side's nodes lost and stopped its own workers.

The messages, what each carries and how a bad one is handled: :mod:`.messages`.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from unirank.supervisor.rdzv.conns import Conn, plain
from unirank.supervisor.rdzv.messages import (
    HELLO_WITHIN,
    JOIN,
    LOST,
    MAX_HELLO_LINE,
    MAX_LINE_IN,
    MAX_UNNAMED,
    RESTART,
    WAIT,
    BadMessage,
    Request,
    authentic,
    hello_refusal,
    hello_tag,
    other_job,
    parse_request,
    place_tag,
    twice,
)
from unirank.supervisor.rdzv.names import node_label, of_records
from unirank.supervisor.rdzv.probe import probe_loop, served
from unirank.supervisor.rdzv.rounds import Pending, behind, follows, members_of, round_closes
from unirank.supervisor.rdzv.spec import RdzvSpec, to_line
from unirank.supervisor.rdzv.wire import BadLine, Lines
from unirank.words import counted

__all__ = ["Server"]


@dataclass(frozen=True)
class Resume:
    """The state a successor takes over (every node holds it from the last round's answer)."""

    round: int
    members: tuple[str, ...]
    records: dict[str, dict[str, Any]]
    #: the nodes known lost (the node that served before, and any found unreachable)
    failed: frozenset[str]
    #: those of them proven dead (:func:`.rounds.has_quorum`)
    dead: frozenset[str] = frozenset()
    #: seconds before the first round may close (0 where the server before is proven dead)
    hold: float = 0.0


class Server:
    """The rendezvous of one job, served on ``listening`` until the process ends; ``host`` is
    the identity of the node whose helper runs it; ``resume`` the state of a server that was
    lost (this one is its successor)."""

    def __init__(self, listening: list[socket.socket], spec: RdzvSpec, host: str,
                 resume: Resume | None = None) -> None:
        self.spec, self.host = spec, host
        self._selector = selectors.DefaultSelector()
        for sock in listening:
            self._selector.register(sock, selectors.EVENT_READ, sock)
        self._nodes: dict[int, Conn] = {}
        self.round = -1
        self.members: tuple[str, ...] = ()
        self.records: dict[str, dict[str, Any]] = {}
        #: nodes of the round before counted alive until they reconnect (after a move)
        self._grace: dict[str, float] = {}
        #: nodes proven dead (:func:`.rounds.has_quorum`); no round closes before ``_hold``
        self._dead: set[str] = set()
        self._hold = 0.0
        #: each node's token (its first hello here gives it; never sent on): a later hello
        #: under its identity must bring it
        self._tokens: dict[str, str] = {}
        if resume is not None:
            self.round, self.members = resume.round, resume.members
            self.records = dict(resume.records)
            grace = time.monotonic() + spec.resume_grace
            self._grace = {m: grace for m in resume.members if m not in resume.failed}
            self._dead = set(resume.dead)
            self._hold = time.monotonic() + resume.hold
        self._waiting: list[str] = []
        #: nodes evicted (``--on-hang evict``), and why
        self._evicted: dict[str, str] = {}
        self._opened: float | None = None
        self._min_at: float | None = None
        self._beat_at = 0.0
        #: where the job runs once this server followed another (:func:`.rounds.follows`)
        self.moved: dict[str, Any] | None = None
        #: a later server of the job its probe found (the loop follows it)
        self.found: dict[str, Any] | None = None
        self.watching = resume is not None

    def start(self) -> None:
        threading.Thread(target=self._loop, name="unirank-rdzv-server", daemon=True).start()
        if self.watching:
            threading.Thread(target=probe_loop, args=(self,), name="unirank-rdzv-watch",
                             daemon=True).start()

    def here(self) -> dict[str, Any]:
        """Where this server's job runs: its node's record's address and the port it serves
        (a successor's rendezvous port, else the endpoint's)."""
        record = self.records.get(self.host, {})
        port = record.get("rdzv_port") if self.watching else self.spec.endpoint_port
        place = (self.members.index(self.host) if self.host in self.members
                 else len(self.members))
        return {"job": self.spec.run_id, "round": self.round, "server": self.host,
                "place": place, "addr": record.get("addr"), "port": port,
                "name": record.get("name")}


    # the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        tick = min(0.25, self.spec.keep_alive_interval / 2)
        while True:
            for key, _ in self._selector.select(tick):
                if isinstance(key.data, socket.socket):
                    self._accept(key.data)
                else:
                    self._read(key.data)
            self._tick()

    def _accept(self, listening: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock, peer = listening.accept()
            node = Conn(Lines(sock, MAX_HELLO_LINE), peer=plain(str(peer[0])))
            unnamed = [n for n in self._nodes.values() if not n.node] \
                if len(self._nodes) >= MAX_UNNAMED else []  # no scan per join below the limit
            if len(unnamed) >= MAX_UNNAMED:  # the oldest silent one goes (a slow sender)
                self._bad(min(unnamed, key=lambda n: n.opened),
                          f"more than {MAX_UNNAMED} connections without a hello")
            self._nodes[sock.fileno()] = node
            self._selector.register(sock, selectors.EVENT_READ, node)

    def _read(self, node: Conn) -> None:
        try:
            messages = node.lines.receive()
        except BadLine as bad:
            self._bad(node, str(bad))
            return
        if messages is None:  # the kernel closed its sockets: proven dead
            self._drop(node, "its connection closed", dead=True)
            return
        node.seen = time.monotonic()
        for message in messages:
            try:
                self._handle(node, parse_request(message))
            except BadMessage as bad:
                self._bad(node, str(bad))
            except Exception as exc:  # nothing a peer sends ends the server
                self._bad(node, f"{type(exc).__name__} while handling it: {exc}")
            if node.lines.closed:
                return

    def _bad(self, node: Conn, why: str) -> None:
        """Close the connection of a peer that sent what the server does not take (one line in
        the rendezvous's log); a node of the job is then lost, not proven dead."""
        who = node_label(node.node, self._names(), address=True) if node.node else \
            f"{node.peer or 'a peer'} (before its hello)"
        sys.stderr.write(f"unirank rdzv: closed the connection of {who}: {why}\n")
        sys.stderr.flush()
        if node.node:
            self._drop(node, f"it sent {why}")
        else:
            self._forget(node)

    def _tick(self) -> None:
        now = time.monotonic()
        for node in list(self._nodes.values()):
            if not node.node and now - node.opened >= HELLO_WITHIN:
                self._bad(node, f"no hello within {HELLO_WITHIN:g} s")
            elif node.node and now - node.seen >= self.spec.lost_after and \
                    not node.lines.waiting():  # what it sent while this loop was busy counts
                why = f"no beat for {now - node.seen:.0f} s"
                node.lines.send({"dropped": why})  # it comes back as a new node, if it hears
                self._drop(node, why)
        if now - self._beat_at >= self.spec.keep_alive_interval:
            self._beat_at = now
            for node in list(self._nodes.values()):
                if node.node:
                    node.lines.send({"beat": 1})
        if self.found is not None and self.moved is None:
            self.point_to(self.found)
        self._maybe_close(now)

    # messages ---------------------------------------------------------------------------
    def _handle(self, node: Conn, request: Request) -> None:
        op, message = request.op, request.fields
        if op == "hello":
            self._hello(node, message)
        elif op == "redirect":
            self._redirect(node, message)
        elif not node.node:
            raise BadMessage(f"{op} before a hello")
        elif op == "join":
            self._join(node, message["record"])
        elif op == "leave":
            self._drop(node, None, dead=True)
        elif op == "abandon":  # it stopped its workers; silence, not death
            self._drop(node, "it heard nothing from the rendezvous's server for "
                             f"{self.spec.fence_after:g} s")
        elif op == "evict":
            if node.node not in self.members:
                raise BadMessage("evict from a node not in the running round")
            self._evict(message["nodes"], str(message.get("why") or "evicted"))

    def _redirect(self, node: Conn, there: dict[str, Any]) -> None:
        """A probe from the server of this job that ran on: follow it where
        :func:`.rounds.follows` says so (every node here is sent there, and so is every later
        hello). A probe whose prober closed its connection already is stale (it waited in the
        queue of a rendezvous port nothing served yet; its server may be gone): ignored, as a
        live prober probes again each beat. A server that closed a round follows only a node of
        its job it knows, at the address that node joined with (anyone who reaches the port
        could name any address)."""
        secret = self.spec.secret
        if node.lines.peer_gone() or \
                (secret and not authentic(there.get("auth"), place_tag(self.spec, "redirect",
                                                                       there))):
            self._forget(node)
            return
        here = self.moved or self.here()
        signed = {"auth": place_tag(self.spec, "here", here)} if secret else {}
        node.lines.send({"here": here, **signed})  # the prober follows where it is behind
        self._forget(node)
        with contextlib.suppress(KeyError, TypeError, ValueError):
            if not follows(served(here), served(there)) or not there.get("addr"):
                return
            known = self.records.get(str(there["server"]), {}).get("addr")
            if self.round >= 0 and not secret and known != there["addr"]:
                return
            self.point_to(there)

    def point_to(self, there: dict[str, Any]) -> None:
        """Send every node here, and every later hello, to the server ``there``."""
        self.moved = dict(there)
        self._waiting = []
        for other in list(self._nodes.values()):
            if other.node:
                other.lines.send({"moved": self.moved})
                self._forget(other)

    def _evict(self, nodes: list[str], why: str) -> None:
        """Stop these nodes (``--on-hang evict``): each is told why and left out for good."""
        self._evicted.update(dict.fromkeys(nodes, why))
        for node in list(self._nodes.values()):
            if node.node in self._evicted:
                node.lines.send({"evicted": self._evicted[node.node]})
                self._drop(node, None, dead=True)

    def _hello(self, node: Conn, message: dict[str, Any]) -> None:
        spec = self.spec
        if message.get("job") != spec.run_id:
            self._refuse(node, other_job(spec, message.get("job")))
            return
        refusal = hello_refusal(spec, message)
        if refusal is not None:
            self._refuse(node, refusal)
            return
        again = next((n for n in self._nodes.values() if n is not node and n.node
                      and n.node == message.get("node")), None)
        token = self._tokens.setdefault(str(message["node"]), str(message.get("token")))
        if token != str(message.get("token")):  # not the node: another process claims it
            self._refuse(node, {"error": f"node {message['node']} takes part already (another "
                                         "process claims its identity)",
                                "hint": "start each node once"})
            return
        if again is not None:  # a node that lost this server and came back: the old is gone
            self._drop(again, "it connected again")
        explicit = message.get("explicit")
        twin = next((n for n in self._nodes.values() if explicit and n.node
                     and n.explicit == explicit), None)
        if twin is not None:
            self._refuse(node, twice(spec, str(explicit), twin.pid, twin.name))
            return
        if self.moved is not None:
            self._refuse(node, {"moved": self.moved})
            return
        if behind(self.round, message.get("round")):
            self._refuse(node, {"behind": self.round})  # it never votes in a round it passed
            return
        if message.get("node") in self._evicted:
            self._refuse(node, {"evicted": self._evicted[str(message.get("node"))]})
            return
        node.node, node.name = str(message["node"]), str(message.get("name") or "")
        node.lines.max_line = MAX_LINE_IN
        node.explicit, node.pid = explicit, message.get("pid") or 0
        self._grace.pop(node.node, None)
        self._dead.discard(node.node)
        signed = {"auth": hello_tag(spec, "ok", node.node, message.get("nonce"))} \
            if spec.secret else {}
        node.lines.send({"ok": True, **self._state(), **signed})

    def _state(self) -> dict[str, Any]:
        """The job's state a node needs to follow the rendezvous should this server be lost
        (also a node that only waits to join: it goes to the same successor)."""
        return {"round": self.round, "members": self.members, "server": self.host,
                "records": [self.records[m] for m in self.members]}

    def _refuse(self, node: Conn, payload: dict[str, Any]) -> None:
        node.lines.send(payload)
        self._forget(node)

    def _join(self, node: Conn, record: dict[str, Any]) -> None:
        if node.node in self._waiting:
            return
        self.records[node.node] = {**record, "seen_addr": node.addr, "pid": node.pid}
        self._waiting.append(node.node)
        self._opened = self._opened if self._opened is not None else time.monotonic()
        running = [m for m in self.members if m not in self._waiting]
        if node.node in self.members:
            self._tell(running, RESTART,
                       f"node {node_label(node.node, self._names())} asked for a new round")
        elif running:
            node.lines.send({"event": f"this node waits to join: the job {self.spec.run_id!r} "
                                      f"runs on {counted(len(self.members), 'node')} (at most "
                                      f"{self.spec.max_nodes}); it joins at the job's next "
                                      "round", "kind": WAIT})
            if len(self.members) < self.spec.max_nodes:
                waiting = sum(1 for n in self._waiting if n not in self.members)
                self._tell(running, JOIN, f"{counted(waiting, 'node')} waiting to join")

    def _drop(self, node: Conn, why: str | None, *, dead: bool = False) -> None:
        """A node left (``why`` None: it said ``leave``) or is lost (``why``); ``dead``: proven
        dead (:func:`.rounds.has_quorum`)."""
        names = self._names()
        self._forget(node)
        if not node.node:
            return
        if dead:
            self._dead.add(node.node)
        if node.node in self._waiting:
            self._waiting.remove(node.node)
        if why is not None and node.node in self.members:
            running = [m for m in self.members if m not in self._waiting and m != node.node]
            label = node_label(node.node, names, address=True)
            self._tell(running, LOST, f"node {label} is lost: {why}")

    def _names(self) -> dict[str, dict[str, Any]]:
        """Every node known, for :func:`.names.node_label`: the records', then those connected
        now (their real addresses, as this server sees them)."""
        names = of_records(self.records.values())
        names.update({n.node: {"name": n.name, "addr": n.addr, "pid": n.pid}
                      for n in self._nodes.values() if n.node})
        return names

    def _forget(self, node: Conn) -> None:
        if node.lines.closed:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(node.lines.sock)
        self._nodes.pop(node.lines.fileno(), None)
        node.lines.close()

    def _tell(self, members: list[str], kind: str, text: str) -> None:
        told, line = frozenset(members), to_line({"event": text, "kind": kind})
        for node in self._nodes.values():
            if node.node in told:
                node.lines.send_line(line)

    # rounds -----------------------------------------------------------------------------
    def _alive(self) -> frozenset[str]:
        now = time.monotonic()
        return frozenset([n.node for n in self._nodes.values() if n.node]
                         + [n for n, until in self._grace.items() if until > now])

    def _maybe_close(self, now: float) -> None:
        if not self._waiting:
            self._opened = self._min_at = None
            return
        if now < self._hold:
            return
        alive = self._alive()
        count = sum(1 for n in self._waiting if n in alive)
        if count < self.spec.min_nodes:
            self._min_at = None
        elif self._min_at is None:
            self._min_at = now
        pending = Pending(before=self.members, alive=alive, waiting=tuple(self._waiting),
                          open_for=now - (self._opened or now),
                          min_for=now - (self._min_at or now),
                          dead=frozenset(self._dead))
        if not round_closes(pending, min_nodes=self.spec.min_nodes,
                            max_nodes=self.spec.max_nodes,
                            last_call=self.spec.last_call_timeout,
                            close_timeout=self.spec.close_timeout):
            return
        self.members = members_of(self.members, self._waiting, alive, self.spec.max_nodes,
                                  self.host)
        self.round += 1
        line = to_line({"round": self.round, "members": self.members,
                        "records": [self.records[m] for m in self.members],
                        "server": self.host})  # encoded once: the same bytes to every member
        members = frozenset(self.members)
        for node in self._nodes.values():
            if node.node in members:
                node.lines.send_line(line)
        self._waiting = [n for n in self._waiting if n not in self.members]
        self._opened = now if self._waiting else None
        self._min_at = None
