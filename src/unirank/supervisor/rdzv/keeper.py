"""The rounds of the rendezvous's server (:mod:`.server`, which adds its connections' loop and
the messages): the job's round, its members and their records, the nodes waiting for the next,
the news each member hears, and the round's message to its members. No torch; reads no
environment variable.

A round closes by :func:`.rounds.round_closes` under its quorum (:func:`.rounds.has_quorum`);
its members are :func:`.rounds.members_of`; it goes to a member that holds the round before as
a change, else whole (:mod:`.change`). A member hears one piece of news per round (a node
lost, one asking for a new round, nodes waiting to join): it passes only the first on; and,
apart from the news, how many spares wait (:meth:`RoundKeeper.say_spares`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from unirank.supervisor.rdzv.change import change_of, full_round
from unirank.supervisor.rdzv.conns import Conn, Conns
from unirank.supervisor.rdzv.linkrule import HOLD_S, RECOVER_S, WINDOW, odd_link, tcp_rtt_us
from unirank.supervisor.rdzv.messages import JOIN, RESTART, WAIT
from unirank.supervisor.rdzv.names import node_label, of_records
from unirank.supervisor.rdzv.rounds import Pending, members_of, round_closes
from unirank.supervisor.rdzv.spec import RdzvSpec, to_line
from unirank.words import counted

__all__ = ["Resume", "RoundKeeper"]


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


class RoundKeeper:
    """The rounds of one job's rendezvous, kept by the server of node ``host`` over the
    connections ``conns``; ``resume``: the state of the server before it (a successor)."""

    def __init__(self, spec: RdzvSpec, host: str, conns: Conns,
                 resume: Resume | None = None) -> None:
        self.spec, self.host, self._conns = spec, host, conns
        self.round = -1
        self.members: tuple[str, ...] = ()
        self.records: dict[str, dict[str, Any]] = {}
        #: nodes of the round before counted alive until they reconnect (after a move)
        self._grace: dict[str, float] = {}
        #: nodes proven dead (:func:`.rounds.has_quorum`); no round closes before ``_hold``
        self._dead: set[str] = set()
        self._hold = 0.0
        if resume is not None:
            self.round, self.members = resume.round, resume.members
            self.records = dict(resume.records)
            grace = time.monotonic() + spec.resume_grace
            self._grace = {m: grace for m in resume.members if m not in resume.failed}
            self._dead = set(resume.dead)
            self._hold = time.monotonic() + resume.hold
        #: the nodes waiting for the next round, in the order they came
        self._waiting: dict[str, None] = {}
        #: the last round's records as its members hold them (a round goes as a change)
        self._sent = dict(self.records)
        #: members of the running round not told news since it closed (each hears the first
        #: only: a node passes one on per round), nor waiting for the next
        self._untold = set(self.members)
        self._opened: float | None = None
        self._min_at: float | None = None
        #: the spare nodes the running round's members were told of last (a round's start:
        #: none)
        self._spares_told: tuple[str, ...] = ()
        #: the node that stands out now and since when; the node named (a slow link)
        self._link: tuple[str | None, float] = (None, 0.0)
        self._link_named: str | None = None
        self._link_at = 0.0
        #: each member connection's last round trips, one a second (:mod:`.linkrule`)
        self._rtts: dict[str, deque[int]] = {}

    def _state(self, known: object) -> dict[str, Any]:
        """The job's state a node needs to follow the rendezvous should this server be lost
        (also a node that only waits to join: it goes to the same successor); its members
        only where the node does not hold this round already (``known``)."""
        if known == self.round:
            return {"round": self.round, "server": self.host}
        return full_round(self.round, self.members, self.records, self.host)

    def _join(self, node: Conn, record: dict[str, Any]) -> None:
        if node.node in self._waiting:
            return
        self.records[node.node] = {**record, "seen_addr": node.addr, "pid": node.pid}
        self._waiting[node.node] = None
        self._untold.discard(node.node)
        self._opened = self._opened if self._opened is not None else time.monotonic()
        if node.node in self.members:
            self._tell(RESTART, lambda: f"node {node_label(node.node, self._names())} asked "
                                        "for a new round")
        elif any(m not in self._waiting for m in self.members):
            node.lines.send({"event": f"this node waits to join: the job {self.spec.run_id!r} "
                                      f"runs on {counted(len(self.members), 'node')} (at most "
                                      f"{self.spec.max_nodes}); it joins at the job's next "
                                      "round", "kind": WAIT})
            if len(self.members) < self.spec.max_nodes:
                waiting = sum(1 for n in self._waiting if n not in self.members)
                self._tell(JOIN, lambda: f"{counted(waiting, 'node')} waiting to join")

    def _names(self) -> dict[str, dict[str, Any]]:
        """Every node known, for :func:`.names.node_label`: the records', then those connected
        now (their real addresses, as this server sees them)."""
        names = of_records(self.records.values())
        names.update({n.node: {"name": n.name, "addr": n.addr, "pid": n.pid}
                      for n in self._conns.named.values()})
        return names

    def _tell(self, kind: str, text: Callable[[], str]) -> None:
        """News for the running round's members not told any since it closed and not waiting
        for the next (each passes only the first on: at thousands of nodes, news for every
        join would cost O(N^2) messages); ``text`` is made only where someone hears it."""
        if not self._untold:
            return
        told, self._untold = self._untold, set()
        line = to_line({"event": text(), "kind": kind})
        for node in self._conns.named.values():
            if node.node in told:
                node.lines.send_line(line)

    def refused_port(self, node: str, connected: Collection[str]) -> None:
        """``node``'s rendezvous port refused a connection (a successor's probe): where it is
        a member of the last round not connected here, it is proven dead, no longer counted
        alive while it might still come (:func:`.rounds.has_quorum`)."""
        if node in self.members and node not in connected:
            self._dead.add(node)
            self._grace.pop(node, None)

    def _alive(self) -> frozenset[str]:
        now = time.monotonic()
        return frozenset([*self._conns.named]
                         + [n for n, until in self._grace.items() if until > now])

    def say_spares(self) -> None:
        """Tell the running round's members how many spares wait, and their names (nodes
        connected and waiting while the job runs at MAX: one takes a lost or evicted node's
        place at the next round; ``--on-slow replace`` reads the count, ``unirank top`` shows
        them), where they changed since the members were told."""
        spares: tuple[str, ...] = ()
        if self._waiting and len(self.members) >= self.spec.max_nodes:  # each tick: cheap
            members, alive = frozenset(self.members), self._conns.named
            spares = tuple(n for n in self._waiting if n not in members and n in alive)
        if spares == self._spares_told:
            return
        self._spares_told = spares
        names = self._names()
        self._say_members({"spares": len(spares), "names": [node_label(n, names) for n in spares]})

    def say_slow_link(self, now: float) -> None:
        """Name a node whose link is slow (:func:`.linkrule.odd_link` over the kernel's
        round trip of each member's connection to this server, held
        :data:`.linkrule.HOLD_S`), and when it no longer is (:data:`.linkrule.RECOVER_S`), in
        one line to each member, whose ``unirank run`` says it and keeps the node named
        (``node``: "" once none is) for ``ur.elastic_state()`` and ``unirank top``."""
        if now - self._link_at < 1.0:  # a look a second: a syscall per member
            return
        self._link_at = now
        for node in self.members:
            conn = self._conns.named.get(node)
            rtt = tcp_rtt_us(conn.lines.sock) if conn is not None else None
            if rtt is not None:
                self._rtts.setdefault(node, deque(maxlen=WINDOW)).append(rtt)
        for node in [n for n in self._rtts if n not in self._conns.named]:
            del self._rtts[node]
        found = odd_link({n: min(seen) for n, seen in self._rtts.items()
                          if n in self.members and len(seen) == WINDOW}, self.host)
        suspect = found[0] if found else None
        if suspect != self._link[0]:
            self._link = (suspect, now)
        held = now - self._link[1]
        if found and suspect != self._link_named and held >= HOLD_S:
            self._link_named = suspect
            label = node_label(found[0], self._names(), address=True)
            self._say_members({"slow_link": (
                f"slow link: node {label}: its messages to the rendezvous take "
                f"{found[1] / 1000:.1f} ms, the other nodes' {found[2] / 1000:.1f} ms (its "
                "link is slow or saturated; every rank's collectives wait for it)"),
                "node": label})
        elif self._link_named and suspect != self._link_named and held >= RECOVER_S:
            label = node_label(self._link_named, self._names(), address=True)
            self._link_named = None
            self._say_members({"slow_link": f"slow link: node {label} no longer", "node": ""})

    def _say_members(self, told: dict[str, Any]) -> None:
        """One line that is no news (nothing restarts) to each member of the running round."""
        line = to_line(told)
        for node in self._conns.named.values():
            if node.node in self.members:
                node.lines.send_line(line)

    def _catch_up(self) -> bool:
        """Read what the waiting nodes sent that is not read yet; True where there was any
        (the connections' loop: :class:`.server.Server`)."""
        return False

    def _maybe_close(self, now: float, *, caught_up: bool = False) -> None:
        """Close the round where :func:`.rounds.round_closes` says so, on what every waiting
        node said last: a join read before this server stalled (frozen, or its thread not run
        for seconds) may since be followed, unread, by that node's ``abandon`` and end (it
        went to a successor: fault seed 157 closed a round of nodes that had left)."""
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
        if not caught_up and self._catch_up():
            self._maybe_close(now, caught_up=True)
            return
        before = self.members
        self.members = members_of(before, tuple(self._waiting), alive, self.spec.max_nodes,
                                  self.host)
        self.round += 1
        self._send_round(before)
        self._spares_told = ()  # a new round's members count none until told
        admitted = frozenset(self.members)
        self._waiting = {n: None for n in self._waiting if n not in admitted}
        self._opened = now if self._waiting else None
        self._min_at = None

    def _send_round(self, before: tuple[str, ...]) -> None:
        """The round just closed to its members: as a change against the round before to
        those that hold it, else whole (:mod:`.change`); each encoded once."""
        whole = to_line(full_round(self.round, self.members, self.records, self.host))
        change = change_of(self.round, before, self._sent, self.members, self.records,
                           self.host)
        short = whole if change is None else to_line(change)
        self._sent = {m: self.records[m] for m in self.members}
        members = frozenset(self.members)
        self._untold = set(members)  # each hears its first news anew
        for node in self._conns.named.values():
            if node.node in members:
                node.lines.send_line(short if node.known == self.round - 1 >= 0 else whole)
                node.known = self.round
