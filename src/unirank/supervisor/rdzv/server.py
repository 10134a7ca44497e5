"""The rendezvous store's server: a thread of the helper of the node that serves the endpoint
(:mod:`.agent`). No torch; reads no environment variable.

It holds the job's small state (its ``--rdzv-id``, the round, the members and their records)
and keeps one connection per node (:mod:`.wire`). A node is any ``unirank run``: several on one
host are several nodes (each helper names itself: host, pid and a random part). A node whose
connection closes without a word (its processes died: the kernel closes their sockets) is lost
at once and *proven dead*, as one that said ``leave`` or was evicted; one silent for
:func:`.conf.lost_after` (a hung machine, a cut network) is lost then and told ``dropped``
(should it hear it, it comes back as a new node); one that says ``abandon`` (it heard nothing
from this server for :func:`.conf.fence_after`) is lost: neither is proven dead; nor is a node
whose hello is read after it closed that connection (a hello it gave up on while this server
was frozen: unanswered, :meth:`Server._hello`). The members
of the running round are told (one ``event``) when one of them is lost, asks for a new round,
or when a new node waits to join. Rounds close by :func:`.rounds.round_closes`, under its
quorum over the nodes of the round before not proven dead (:func:`.rounds.has_quorum`).

A successor (a server resumed from the last round) probes the original endpoint and the other
members' rendezvous ports once per beat interval (a member whose port refuses is proven dead:
:mod:`.probe`): a server of the job found there at an
earlier round follows it, one at a later round is followed (:func:`.rounds.follows`; the probe
is answered with ``here``); a server that followed answers ``moved`` to its nodes and to every
later hello. A successor not told that the server before it died (its address refused) waits
``hold`` seconds before its first round: the other side of a split, cut off but alive, has then
declared this side's nodes lost and stopped its own workers.

The messages, what each carries and how a bad one is handled: :mod:`.messages`; the rounds
(members, records, waiting nodes, news, the round's message): :mod:`.keeper`, which this class
extends with the connections' loop.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import sys
import threading
import time
from typing import Any

from unirank.supervisor.rdzv.conns import Conn, Conns, plain
from unirank.supervisor.rdzv.keeper import Resume, RoundKeeper
from unirank.supervisor.rdzv.messages import (
    HELLO_WITHIN,
    LOST,
    MAX_HELLO_LINE,
    MAX_LINE_IN,
    MAX_UNNAMED,
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
from unirank.supervisor.rdzv.names import node_label
from unirank.supervisor.rdzv.probe import probe_loop, served
from unirank.supervisor.rdzv.rounds import behind, follows, place_of
from unirank.supervisor.rdzv.spec import RdzvSpec, to_line
from unirank.supervisor.rdzv.wire import SEND_TIMEOUT, BadLine, Lines

__all__ = ["CHECK_EVERY", "RETIRE_WAIT", "Resume", "Server"]

#: seconds between two scans of every node by the server's loop (a round that can close closes
#: within it)
CHECK_EVERY = 0.02
#: the longest :meth:`Server.retire` waits for the loop to end (it wakes each tick, 0.25 s)
RETIRE_WAIT = 5.0


class Server(RoundKeeper):
    """The rendezvous of one job, served on ``listening`` until the process ends; ``host`` is
    the identity of the node whose helper runs it; ``resume`` the state of a server that was
    lost (this one is its successor)."""

    def __init__(self, listening: list[socket.socket], spec: RdzvSpec, host: str,
                 resume: Resume | None = None) -> None:
        self._selector = selectors.DefaultSelector()
        #: the sockets it accepts on (a later server of this process may take them over:
        #: :meth:`retire`)
        self.listening = tuple(listening)
        for sock in listening:
            self._selector.register(sock, selectors.EVENT_READ, sock)
        super().__init__(spec, host, Conns(self._selector), resume)
        #: each node's token (its first hello here gives it; never sent on): a later hello
        #: under its identity must bring it
        self._tokens: dict[str, str] = {}
        #: nodes evicted (``--on-hang evict``), and why
        self._evicted: dict[str, str] = {}
        self._beat_at = 0.0
        #: set once this server's own node left and no other node is connected any more
        self.drained = threading.Event()
        self._ending = False
        #: where the job runs once this server followed another (:func:`.rounds.follows`)
        self.moved: dict[str, Any] | None = None
        #: a later server of the job its probe found (the loop follows it)
        self.found: dict[str, Any] | None = None
        #: members whose rendezvous port refused the probe (the loop counts them dead)
        self._refused: list[str] = []
        self.watching = resume is not None
        self._retired = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="unirank-rdzv-server",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()
        if self.watching:
            threading.Thread(target=probe_loop, args=(self,), name="unirank-rdzv-watch",
                             daemon=True).start()

    def here(self) -> dict[str, Any]:
        """Where this server's job runs: its node's record's address and the port it serves
        (a successor's rendezvous port, else the endpoint's)."""
        record = self.records.get(self.host, {})
        port = record.get("rdzv_port") if self.watching else self.spec.endpoint_port
        return {"job": self.spec.run_id, "round": self.round, "server": self.host,
                "place": place_of(self.host, self.members), "addr": record.get("addr"),
                "port": port, "name": record.get("name")}

    def connected(self) -> frozenset[str]:
        """The nodes connected now (read by the probe's thread: a copy made under the GIL)."""
        return frozenset(self._conns.named)

    def proven_dead(self) -> frozenset[str]:
        """The nodes proven dead (read by the probe's thread: a copy made under the GIL)."""
        return frozenset(self._dead)

    def refused(self, node: str) -> None:
        """The probe's thread: ``node``'s rendezvous port refused (the loop takes it)."""
        self._refused.append(node)

    @property
    def retired(self) -> bool:
        """Whether :meth:`retire` stopped this server."""
        return self._retired.is_set()

    def retire(self) -> tuple[socket.socket, ...]:
        """Stop serving, for a new server of this process that takes the same ports over (its
        node takes the rendezvous over again: two servers accepting on one port would answer
        a node by turns, one of them ``moved`` to that very port: fault seeds 160 and 168);
        the sockets it listened on, left open. Waits for its loop to end (a tick at most)."""
        self._retired.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(RETIRE_WAIT)
        return self.listening

    # the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        """Read what arrived; every :data:`CHECK_EVERY` at most (a scan of every node, not one
        per wake: thousands of nodes send thousands of messages a second), time limits, beats
        and whether the round closes (every ``tick`` where no round is pending); until
        :meth:`retire`."""
        tick, checked = min(0.25, self.spec.keep_alive_interval / 2), 0.0
        while not self._retired.is_set():
            for key, events in self._selector.select(CHECK_EVERY if self._waiting else tick):
                if isinstance(key.data, socket.socket):
                    self._accept(key.data)
                    continue
                if events & selectors.EVENT_WRITE:  # no wake for it once all went
                    key.data.lines.flush()
                    self._conns.watch_writes(key.data)
                if events & selectors.EVENT_READ:
                    self._read(key.data)
            if time.monotonic() - checked >= CHECK_EVERY:
                checked = time.monotonic()
                self._tick()
        for node in self._conns.all():
            self._forget(node)
        for sock in self.listening:
            self._selector.unregister(sock)
        self._selector.close()

    def _accept(self, listening: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock, peer = listening.accept()
            node = Conn(Lines(sock, MAX_HELLO_LINE, queued=True), peer=plain(str(peer[0])))
            unnamed = self._conns.unnamed
            if len(unnamed) >= MAX_UNNAMED:  # the oldest silent one goes (a slow sender)
                self._bad(min(unnamed.values(), key=lambda n: n.opened),
                          f"more than {MAX_UNNAMED} connections without a hello")
            self._conns.add(node)

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

    def _catch_up(self) -> bool:
        """Read the waiting nodes' connections that hold what this loop has not read (only as
        a round is about to close: a poll per waiting node); True where any did."""
        late = [conn for name in tuple(self._waiting)
                if (conn := self._conns.named.get(name)) is not None and conn.lines.waiting()]
        for conn in late:
            self._read(conn)
        return bool(late)

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
        for node in self._conns.all():
            if not node.node and now - node.opened >= HELLO_WITHIN:
                self._bad(node, f"no hello within {HELLO_WITHIN:g} s")
            elif node.node and now - node.seen >= self.spec.lost_after and \
                    not node.lines.waiting():  # what it sent while this loop was busy counts
                why = f"no beat for {now - node.seen:.0f} s"
                node.lines.send({"dropped": why})  # it comes back as a new node, if it hears
                self._drop(node, why)
            elif node.lines.stalled_for(now) >= SEND_TIMEOUT:
                self._drop(node, f"it took nothing sent to it for {SEND_TIMEOUT:g} s")
            else:
                self._conns.watch_writes(node)
        if now - self._beat_at >= self.spec.keep_alive_interval:
            self._beat_at = now
            beat = to_line({"beat": 1})
            for node in self._conns.all():
                if node.node:
                    node.lines.send_line(beat)
        if self.found is not None and self.moved is None:
            self.point_to(self.found)
        while self._refused:
            self.refused_port(self._refused.pop(), self._conns.named)
        self._maybe_close(now)
        self.say_spares()
        self.say_slow_link(now)

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
            self._ending = self._ending or node.node == self.host
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
        live prober probes again each beat. Without a secret, a server that closed a round
        follows only a node of its job it knows, at the address and rendezvous port that node
        joined with, probing from the address its own connection came from (anyone who reaches
        the port could name any place; :meth:`_vouched`)."""
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
            if self.round >= 0 and not secret and not self._vouched(node, there):
                return
            self.point_to(there)

    def _vouched(self, probe: Conn, there: dict[str, Any]) -> bool:
        """Whether a probe's place ``there`` is where its node joined this job (its record's
        address and rendezvous port), and the probe came from where that node's connection
        here came from, where this server saw one."""
        name = str(there["server"])
        record, seen = self.records.get(name, {}), self._conns.peers.get(name)
        return bool(record) and there["addr"] == record.get("addr") and \
            there.get("port") == record.get("rdzv_port") and seen in (None, probe.peer)

    def point_to(self, there: dict[str, Any]) -> None:
        """Send every node here, and every later hello, to the server ``there``."""
        self.moved = dict(there)
        self._waiting = {}
        for other in self._conns.all():
            if other.node:
                other.lines.send({"moved": self.moved})
                self._forget(other)

    def _evict(self, nodes: list[str], why: str) -> None:
        """Stop these nodes (``--on-hang evict``): each is told why and left out for good."""
        self._evicted.update(dict.fromkeys(nodes, why))
        for node in self._conns.all():
            if node.node in self._evicted:
                node.lines.send({"evicted": self._evicted[node.node]})
                self._drop(node, None, dead=True)

    def _hello(self, node: Conn, message: dict[str, Any]) -> None:
        spec = self.spec
        if node.lines.peer_gone():  # stale: its sender gave up on it (this server was frozen)
            self._forget(node)  # unanswered; its end proves nothing about the node
            return
        if message.get("job") != spec.run_id:
            self._refuse(node, other_job(spec, message.get("job")))
            return
        refusal = hello_refusal(spec, message)
        if refusal is not None:
            self._refuse(node, refusal)
            return
        again = self._conns.named.get(str(message["node"]))
        again = None if again is node else again
        token = self._tokens.setdefault(str(message["node"]), str(message.get("token")))
        if token != str(message.get("token")):  # not the node: another process claims it
            self._refuse(node, {"error": f"node {message['node']} takes part already (another "
                                         "process claims its identity)",
                                "hint": "start each node once"})
            return
        if again is not None:  # a node that lost this server and came back: the old is gone
            self._drop(again, "it connected again")
        explicit = message.get("explicit")
        twin = next((n for n in self._conns.named.values() if n.explicit == explicit), None) \
            if explicit else None
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
        self._conns.name(node, str(message["node"]), str(message.get("name") or ""))
        node.lines.max_line = MAX_LINE_IN
        node.explicit, node.pid = explicit, message.get("pid") or 0
        self._grace.pop(node.node, None)
        self._dead.discard(node.node)
        signed = {"auth": hello_tag(spec, "ok", node.node, message.get("nonce"))} \
            if spec.secret else {}
        node.lines.send({"ok": True, **self._state(message.get("known")), **signed})
        node.known = self.round

    def _refuse(self, node: Conn, payload: dict[str, Any]) -> None:
        node.lines.send(payload)
        self._forget(node)

    def _drop(self, node: Conn, why: str | None, *, dead: bool = False) -> None:
        """A node left (``why`` None: it said ``leave``) or is lost (``why``); ``dead``: proven
        dead (:func:`.rounds.has_quorum`)."""
        seen = {node.node: {"name": node.name, "addr": node.addr, "pid": node.pid}}
        self._forget(node)
        if not node.node:
            return
        if dead:
            self._dead.add(node.node)
        self._waiting.pop(node.node, None)
        self._untold.discard(node.node)
        if why is not None and node.node in self.members:
            def text() -> str:
                label = node_label(node.node, {**self._names(), **seen}, address=True)
                return f"node {label} is lost: {why}"
            self._tell(LOST, text)

    def _forget(self, node: Conn) -> None:
        self._conns.forget(node)
        if self._ending and not self._conns.named:  # its node left, then every other
            self.drained.set()  # (.conf.DRAIN_TIMEOUT)

