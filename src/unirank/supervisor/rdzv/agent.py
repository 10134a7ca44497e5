"""The rendezvous helper of one node: ``python -m unirank.supervisor.rdzv.agent`` (no torch; the
``unirank run`` parent starts it through :mod:`.client`).

It reads one :class:`~.spec.RdzvSpec` (a JSON line) on stdin, then

1. serves the rendezvous at the endpoint (:class:`~.server.Server`, a thread of this process)
   where this node is on the endpoint's host and the port is free (another node of the host may
   serve it already: then this one is a client, as every other node);
2. connects to it and says hello: its job (a node of another job is refused), its identity (host,
   parent pid and a random part: any number of ``unirank run`` on one host are separate nodes)
   and its ``--local-addr`` where one was given (the same explicit address twice is one node
   started twice: refused);
3. asks to join a round with its :class:`~.spec.NodeRecord`, and answers the parent this node's
   :class:`~.spec.Assignment` (:func:`~.spec.assign` over the round's records) as one JSON line
   on stdout;
4. beats every ``keep_alive_interval`` and passes the server's news on (one ``{"event": ...}``
   line per round: a node lost, a node asking for a new round, nodes waiting to join where the
   parent can admit them) until stdin says ``next`` (join the next round) or ends (the parent
   is done or gone): then it says ``leave`` and exits.

Where the node serving the rendezvous is silent for :func:`.conf.fence_after`, the node first
stops its workers (news to the parent), then, as where its connection ends, leaves it
(``abandon``) and says hello there again; where nothing answers it goes to the successor
(:func:`~.rounds.successor` over the last round, which the hello's answer gives a node that
only waits to join too) or becomes it, the lost server counted proven dead only where its
address refused or its connection ended without a word (:func:`~.rounds.has_quorum`).
Where its server answers ``moved`` (a fresh server at the endpoint that followed the job's
running server, :func:`~.rounds.follows`), it goes there and joins at the job's next round.

A refusal is answered as ``{"error": ..., "variable": ..., "value": ..., "hint": ...}`` (the
parent raises it as a one-line ConfigError). Reads no environment variable.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import selectors
import socket
import sys
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, NoReturn

from unirank.contract import RDZV_SECRET_VAR
from unirank.exitcodes import EVICTED
from unirank.supervisor.rdzv.change import BadChange, read_round
from unirank.supervisor.rdzv.conf import DRAIN_TIMEOUT
from unirank.supervisor.rdzv.linkrule import quick_ack
from unirank.supervisor.rdzv.messages import FENCED, MOVED, WAIT, authentic, hello_tag
from unirank.supervisor.rdzv.probe import rdzv_address
from unirank.supervisor.rdzv.reach import (
    MAX_HOPS,
    REASK_S,
    REDIRECT_TRY_S,
    Refusal,
    connect,
    endpoint,
    endpoint_socket,
    node_identity,
    serve_if_endpoint,
)
from unirank.supervisor.rdzv.rounds import place_of, successor
from unirank.supervisor.rdzv.spec import NodeRecord, RdzvSpec, assign, to_line
from unirank.words import counted

if TYPE_CHECKING:
    from unirank.supervisor.rdzv.server import Server

__all__ = ["MAX_HOPS", "Refusal", "main", "node_identity"]


def _evicted(why: str) -> Refusal:
    """This node was evicted (``--on-hang evict``, ``--on-slow evict``): the parent ends with
    :data:`unirank.exitcodes.EVICTED`."""
    return Refusal(why, hint="the other nodes go on without this one; rank 0's node said why "
                   "(its hang report, or its straggler line)", exit_code=EVICTED)


class Node:
    """This node's side of the rendezvous: hello, join, beats, news, and taking the rendezvous
    over where the node serving it is lost (see the module)."""

    def __init__(self, spec: RdzvSpec, node: str, local: Server | None) -> None:
        from unirank.supervisor.listen import open_store_socket

        self.spec, self.node, self.serves = spec, node, local is not None
        #: proves a later hello under this node's identity is this node's (never shown)
        self.token = secrets.token_hex(16)
        #: every server this process runs, the newest last (:attr:`local`; an endpoint's
        #: server that followed the job serves on beside a successor)
        self.locals: list[Server] = [local] if local is not None else []
        self.explicit = spec.local_addr if spec.explicit_addr else None
        #: where this node serves the rendezvous, should it take it over
        self.spare = open_store_socket(0, host=spec.master_addr(), option="--local-addr")
        #: the server's address this node is connected to, and where a ``moved`` sent it
        #: last (its server, name, address and port)
        self.address = (spec.endpoint_host, spec.endpoint_port)
        self.place: dict[str, Any] = {}
        self.lines = connect(spec, self.address, time.monotonic() + spec.join_timeout)
        self.selector = selectors.DefaultSelector()
        self.joining = self.told = False
        #: the parent's run succeeded (:meth:`_from_parent`)
        self.done = False
        #: the server said it dropped this node (its connection's end then proves nothing)
        self.dropped = False
        self.deadline = self.heard = time.monotonic()
        #: the last round: its number, members (in order), records and the node serving it;
        #: ``known``: the round whose members it holds (a later one where a hello's answer
        #: gave it: :mod:`.change`)
        self.round, self.server, self.known = -1, "", -1
        self.members: tuple[str, ...] = ()
        self.records: dict[str, dict[str, Any]] = {}

    def hello(self, deadline: float, *, reask: bool = False) -> None:
        """Say who this node is; where the server answers ``moved`` (it followed the job's
        running server, :func:`.rounds.follows`), say it there (at most :data:`MAX_HOPS` in
        a row). ``reask`` (a node's first hello, at the endpoint): a server sent to that no
        longer listens (its node was lost or replaced, and the news has not reached the
        endpoint yet), or more than :data:`MAX_HOPS` of them in a row (servers that point at
        each other while they learn where the job runs), send this node back to the endpoint,
        which it asks again after :data:`REASK_S`, until ``deadline``."""
        hops = 0
        while True:
            there = self._hello_once(deadline)
            if there is None:
                return
            hops += 1
            many = f"the rendezvous at {endpoint(self.spec)} sent this node on more than " \
                f"{MAX_HOPS} times"
            if hops > MAX_HOPS and not reask:
                raise Refusal(many, hint="run again; if it repeats, report it")
            if hops > MAX_HOPS:
                self._back_to_endpoint(deadline, many)
                hops = 0
                continue
            if not reask:
                self._reconnect(there, deadline)
                continue
            try:
                self._reconnect(there, min(deadline, time.monotonic() + REDIRECT_TRY_S),
                                refused_ends=True)
            except Refusal as gone:
                self._back_to_endpoint(deadline, str(gone))
                hops = 0

    def _back_to_endpoint(self, deadline: float, why: str) -> None:
        """Ask the endpoint again, after :data:`REASK_S` (``why``: the refusal where
        ``deadline`` comes first)."""
        if time.monotonic() + REASK_S >= deadline:
            raise Refusal(why, hint="run again; if it repeats, report it")
        time.sleep(REASK_S)
        self._reconnect({"addr": self.spec.endpoint_host, "port": self.spec.endpoint_port},
                        deadline)

    def _hello_once(self, deadline: float) -> dict[str, Any] | None:
        """One hello and its answer: where the server sent this node on (``moved``), else
        None (the answer taken)."""
        nonce = secrets.token_hex(16)
        signed = {"auth": hello_tag(self.spec, "hello", self.node, nonce)} \
            if self.spec.secret else {}
        self.lines.send({"op": "hello", "job": self.spec.run_id, "node": self.node,
                         "name": self.spec.node_name, "explicit": self.explicit,
                         "pid": os.getppid(), "round": self.round, "known": self.known,
                         "nonce": nonce, "token": self.token, **signed})
        while True:
            for message in self._wait(deadline, "the rendezvous's answer"):
                if "behind" in message:  # a server of a side that lost the job: not the job
                    behind = Refusal(f"the rendezvous at {self.address[0]}:{self.address[1]} "
                                     f"is at round {message['behind']}, behind this node's "
                                     f"round {self.round}", hint="it looks further")
                    behind.silent = True
                    raise behind
                if "moved" in message:
                    return dict(message["moved"])
                if "evicted" in message:
                    raise _evicted(str(message["evicted"]))
                if "error" in message:
                    raise Refusal(str(message["error"]), variable=message.get("variable"),
                                  value=message.get("value"), hint=str(message.get("hint")))
                if message.get("ok"):
                    if self.spec.secret and not authentic(
                            message.get("auth"), hello_tag(self.spec, "ok", self.node, nonce)):
                        raise Refusal(f"the rendezvous at {endpoint(self.spec)} does not hold "
                                      f"this job's secret ({RDZV_SECRET_VAR})",
                                      hint="give every node of one job the same secret")
                    self.heard = time.monotonic()
                    self._learn(message)
                    return None

    def _learn(self, state: dict[str, Any]) -> None:
        """The last round and its server, from the hello's answer: a node waiting to join
        (in no round yet) follows the rendezvous to the same successor as the members. The
        members come only where this node did not hold that round already."""
        number = int(state.get("round", -1))
        if not state.get("server") or number < max(self.round, self.known):
            return
        if state.get("members"):
            self.members, self.records = read_round(state, self.known, self.members,
                                                    self.records)
            self.known = number
        if number == self.known >= 0:
            self.server = str(state["server"])

    def _wait(self, deadline: float, what: str) -> list[dict[str, Any]]:
        left = deadline - time.monotonic()
        with selectors.DefaultSelector() as selector:
            selector.register(self.lines.sock, selectors.EVENT_READ)
            if left <= 0 or not selector.select(left):
                silent = Refusal(f"no answer from the rendezvous at {endpoint(self.spec)} "
                                 f"({what})", hint="run again; if it repeats, check the endpoint")
                silent.silent = True
                raise silent
        messages = self.lines.receive()
        if messages is None:
            closed = Refusal(f"the rendezvous at {endpoint(self.spec)} closed its connection",
                             hint="its node ended: start the job again")
            closed.silent = True
            raise closed
        return messages

    def join(self) -> None:
        record = NodeRecord(addr=self.spec.master_addr(), name=self.spec.node_name,
                            nproc=self.spec.nproc, store_port=self.spec.store_port,
                            serves_endpoint=self.serves, claim=self.node,
                            rdzv_port=int(self.spare.getsockname()[1]))
        self.joining, self.told = True, False
        self.deadline = time.monotonic() + self.spec.join_timeout
        if not self.lines.send({"op": "join", "record": asdict(record)}):
            self.move()

    def _reconnect(self, there: dict[str, Any], deadline: float, *,
                   refused_ends: bool = False) -> None:
        """Leave the server that followed another and connect to that one (``refused_ends``:
        a refusal ends the tries at once)."""
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.lines.sock)
        self.lines.close()
        self.serves = False
        self.address, self.place = (str(there["addr"]), int(there["port"])), dict(there)
        self.lines = connect(self.spec, self.address, deadline, refused_ends=refused_ends)

    def follow(self, there: dict[str, Any]) -> None:
        """The server here followed the job's running server: join that one (at its next
        round; the workers of a round run here are stopped first)."""
        wait = self.spec.reconnect_within
        self._reconnect(there, time.monotonic() + wait)
        self.hello(time.monotonic() + wait)
        self._point_local(str(self.place.get("server") or ""), str(self.place.get("name") or ""),
                          self.place)
        self._rejoin(f"store moved to node {there.get('name')} ({there['addr']}): the job "
                     "runs there")

    def _rejoin(self, news: str, kind: str = MOVED) -> None:
        """After a new connection: watch it, join again if this node was joining, tell (the
        news of ``kind``)."""
        self.selector.register(self.lines.sock, selectors.EVENT_READ, "store")
        self.heard = time.monotonic()
        if self.joining:
            self.join()
        self._tell(news, always=True, kind=kind)

    def on_message(self, message: dict[str, Any]) -> None:
        if "dropped" in message:  # the server runs: the end of this connection proves nothing
            self.dropped = True
        if "moved" in message:
            self.follow(message["moved"])
            return
        if "slow_link" in message:  # the server's line on a slow link: the parent says it
            _answer({"slow_link": str(message["slow_link"]),  # and keeps the node
                     "node": str(message.get("node") or "")})
            return
        if "spares" in message:  # the nodes waiting beyond MAX: the parent keeps them, no news
            with contextlib.suppress(TypeError, ValueError):
                _answer({"spares": max(int(message["spares"]), 0),  # the parent reads the
                         "names": message.get("names") or []})  # names (rdzv.client.spares_told)
            return
        if "evicted" in message:  # said now (the parent reads it while its workers run)
            raise _evicted(str(message["evicted"]))
        if "error" in message:
            raise Refusal(str(message["error"]), variable=message.get("variable"),
                          value=message.get("value"), hint=str(message.get("hint")))
        if "round" in message and self.joining:
            try:
                self.members, self.records = read_round(message, self.known, self.members,
                                                        self.records)
            except BadChange as bad:
                raise Refusal(f"the rendezvous at {endpoint(self.spec)} sent {bad}",
                              hint="run again; if it repeats, report it") from None
            self.round = self.known = int(message["round"])
            self.server = str(message.get("server") or "")
            records = [NodeRecord(**self.records[m]) for m in self.members]
            _answer(assign(records, self.members.index(self.node), self.round))
            self.joining = False
        elif "event" in message:  # nodes waiting to join too: admitted at any budget
            kind = message.get("kind")
            self._tell(str(message["event"]), always=kind == WAIT,
                       kind=kind if isinstance(kind, str) else None)

    def _tell(self, news: str, *, always: bool = False, kind: str | None = None) -> None:
        """Pass news on to the parent, once per round, while the workers run (``always``:
        whatever was told before, and while it waits for a round, which then only says it),
        with its ``kind`` where the server gave one (``join``: a change of membership, which
        spends no restart)."""
        payload = {"event": news, **({"kind": kind} if kind else {})}
        if always or (not self.joining and not self.told):
            _answer(payload)
            self.told = self.told or not self.joining

    def move(self, *, ended: bool = False) -> None:
        """The server went silent or its connection ended (``ended``): leave it (``abandon``:
        silence, not death, should it still run), and join the job again at the same server
        where it answers, else at its successor (:func:`~.rounds.successor` over the last
        round's members), or become it. The server is proven dead
        (:func:`~.rounds.has_quorum`) where its address refuses, or where its connection ended
        without a word (no ``dropped``: the kernel closed it) and it does not answer."""
        self.lines.send({"op": "abandon"})
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.lines.sock)
        self.lines.close()
        lost = self.server
        back = self._back()
        if back is True:
            self.dropped = False  # the server answered, or one that took the endpoint over
            if self.server != lost:
                self._point_local(self.server, self._name_of(self.server))
                self._rejoin(self._moved_to(self.server))
            else:
                self._rejoin("this node lost the rendezvous's server for a while: it joins the "
                             "job's next round", FENCED)
            return
        proven, self.dropped = back is None or (ended and not self.dropped), False
        failed, dead = {lost}, ({lost} if proven else set())
        wait = self.spec.reconnect_within
        while True:
            chosen = successor(self.members, failed) if self.server else None
            if chosen is None:
                raise Refusal(f"the rendezvous at {endpoint(self.spec)} ended (its node "
                              "ended) and no node of the last round serves it",
                              hint="start the job again")
            record = self.records[chosen]
            if chosen == self.node:
                self._take_over(frozenset(failed), frozenset(dead), record)
            self.address = rdzv_address(record)
            try:
                self.lines = connect(self.spec, self.address, time.monotonic() + wait,
                                     refused_ends=True)
                self.hello(time.monotonic() + wait)
                break
            except Refusal as refusal:
                if not (refusal.refused or refusal.silent):
                    raise
                failed.add(chosen)
                dead.update([chosen] if refusal.refused else [])
        self.server = chosen
        if chosen != self.node:
            self._point_local(chosen, str(record.get("name") or ""))
        self._rejoin(self._moved_to(chosen))

    def _moved_to(self, server: str) -> str:
        """The news that the rendezvous moved to the node ``server``."""
        from unirank.supervisor.rdzv.names import node_label, of_records

        label = node_label(server, of_records(self.records.values()), address=True)
        return f"store moved to node {label}"

    def _back(self) -> bool | None:
        """Connect to the server this node lost again and say hello: True where it answered
        (the caller joins its next round), None where its address refused (its helper is
        gone: proven dead), False where it stays silent (one beat interval)."""
        deadline = time.monotonic() + self.spec.keep_alive_interval
        try:
            self.lines = connect(self.spec, self.address, deadline, refused_ends=True)
            self.hello(deadline)
        except Refusal as refusal:
            if not (refusal.refused or refusal.silent):
                raise
            with contextlib.suppress(AttributeError):
                self.lines.close()
            return None if refusal.refused else False
        return True

    def _take_over(self, failed: frozenset[str], dead: frozenset[str],
                   record: dict[str, Any]) -> None:
        """Serve the rendezvous here, resumed from the last round (this node is the
        successor); a server this process ran at the endpoint (one that followed the job
        here) now sends the nodes that reach it to this one. A server this process ran as a
        successor before (it has followed the job since) stops, and its ports go to the new
        one: one server per port."""
        from unirank.supervisor.rdzv.server import Resume, Server

        held: list[socket.socket] = []  # a successor this process ran before: its ports
        for before in [s for s in self.locals if self.spare in s.listening]:
            held.extend(before.retire())
            self.locals.remove(before)
        listening = list(dict.fromkeys([self.spare, *held,
                                        *filter(None, [endpoint_socket(self.spec)])]))
        hold = 0.0 if self.server in dead else self.spec.successor_hold
        server = Server(listening, self.spec, self.node,
                        Resume(self.round, self.members, self.records, failed, dead, hold))
        server.start()
        self.address = rdzv_address(record)
        self._point_local(self.node, str(record.get("name") or ""))
        self.serves = True
        self.locals.append(server)

    @property
    def local(self) -> Server | None:
        """The server this process runs now (at the endpoint, or as the successor)."""
        return self.locals[-1] if self.locals else None

    def _point_local(self, chosen: str, name: str,
                     there: dict[str, Any] | None = None) -> None:
        """Every server this process runs that follows another (``moved``: the endpoint's,
        once the job's server was elsewhere) sends the nodes that reach it to ``chosen``, the
        server this node's connection goes to now (:attr:`address`), whichever way this node
        got there (a ``moved`` followed, a lost server's successor, a server that took the
        endpoint over): else it would name a lost server to every probe and every node
        started again, or send them around servers that point at each other. It names that
        server's round and place as the server itself does (:meth:`.server.Server.here`;
        ``there``: as the ``moved`` followed gave them): a pointer that named a successor
        first of its round (no place) made a server that was first follow it while the
        successor followed that server, each to the other (fault seed 168)."""
        given = there or {}
        for local in self.locals:
            if local.moved is not None:
                local.moved = {"job": self.spec.run_id,
                               "round": given.get("round", self.round),
                               "place": given.get("place", place_of(chosen, self.members)),
                               "server": chosen, "addr": self.address[0],
                               "port": self.address[1], "name": name}

    def _name_of(self, server: str) -> str:
        return str(self.records.get(server, {}).get("name") or "")

    def run(self) -> None:
        """Join, then serve the parent until its stdin ends."""
        self.selector.register(0, selectors.EVENT_READ, "parent")
        self.selector.register(self.lines.sock, selectors.EVENT_READ, "store")
        self.join()
        beat_at = 0.0
        while True:
            for key, _ in self.selector.select(min(0.5, self.spec.keep_alive_interval / 2)):
                if key.data == "parent":
                    if not self._from_parent():
                        return
                else:  # read before the silence is judged: a frozen node resumed
                    self._from_store()
            now = time.monotonic()
            if now - beat_at >= self.spec.keep_alive_interval:
                beat_at = now
                self.lines.send({"op": "beat"})
            if self.joining and now >= self.deadline:
                raise Refusal(
                    f"the rendezvous {self.spec.run_id!r} at {endpoint(self.spec)} did "
                    f"not complete within join_timeout={self.spec.join_timeout:g} s "
                    f"(fewer than {counted(self.spec.min_nodes, 'node')} joined)",
                    hint="start unirank run with the same --rdzv-endpoint and --rdzv-id "
                    "on the other nodes, or raise --rdzv-conf join_timeout")
            if now - self.heard >= self.spec.fence_after and self.server != self.node:
                # the node serving it is silent (hung, or cut off): fence first
                self._tell(f"no word from the rendezvous's server for "
                           f"{now - self.heard:.1f} s", kind=FENCED)
                self.move()

    def _from_parent(self) -> bool:
        """The parent's ``{"next": true, "evict": [...], "why": ...}``, ``{"done": true}`` (its
        run succeeded), or its end: this node leaves; where it serves the rendezvous and the
        run succeeded, it serves on until the other nodes left (:data:`.conf.DRAIN_TIMEOUT`
        at most)."""
        line = os.read(0, 65536)
        if not line.strip():
            self.lines.send({"op": "leave"})
            if self.done and self.local is not None:
                self.local.drained.wait(DRAIN_TIMEOUT)
            return False
        order: dict[str, Any] = {}
        with contextlib.suppress(ValueError, AttributeError):
            order = json.loads(line.splitlines()[-1])
        if order.get("done"):
            self.done = True
            return True
        if order.get("evict"):
            self.lines.send({"op": "evict", "nodes": order["evict"], "why": order["why"]})
        self.join()
        return True

    def _from_store(self) -> None:
        messages = self.lines.receive()
        if messages is None:
            self.move(ended=True)
            return
        quick_ack(self.lines.sock)  # the server's beats acknowledged at once: :mod:`.linkrule`
        self.heard = time.monotonic()
        for message in messages:
            self.on_message(message)


def _first_line() -> bytes:
    """The spec's line, read from fd 0 unbuffered (``next`` lines are read there later)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(0, 1)
        if not chunk:
            break
        data += chunk
    return data


def _answer(payload: object) -> None:
    os.write(1, to_line(payload))


def _serve(spec: RdzvSpec) -> None:
    identity = node_identity()
    node = Node(spec, identity, serve_if_endpoint(spec, identity))
    node.hello(time.monotonic() + min(spec.join_timeout, 30.0), reask=True)
    node.run()


def main() -> NoReturn:
    """The helper's entry: one spec in, assignments out, until stdin ends."""
    from unirank.supervisor.worker.pdeathsig import set_parent_death_signal

    set_parent_death_signal()
    code = 0
    try:
        _serve(RdzvSpec(**json.loads(_first_line())))
    except Refusal as refusal:
        _answer(refusal.payload)
        code = 2
    except Exception as exc:  # said in one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        _answer({"error": f"the rendezvous failed: {type(exc).__name__}: {first}"})
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the server's thread ends with it


if __name__ == "__main__":
    main()
