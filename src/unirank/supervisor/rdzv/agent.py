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

Where the node serving the rendezvous is lost, the node goes to its successor
(:func:`~.rounds.successor` over the last round, which the hello's answer gives a node that
only waits to join too) or becomes it; where its server answers ``moved`` (a fresh server at
the endpoint that followed the job's running server, :func:`~.rounds.follows`), it goes
there and joins at the job's next round.

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

from unirank.exitcodes import EVICTED
from unirank.supervisor.rdzv.spec import NodeRecord, RdzvSpec, assign, to_line
from unirank.supervisor.rdzv.wire import Lines
from unirank.words import counted

if TYPE_CHECKING:
    from unirank.supervisor.rdzv.server import Server

__all__ = ["MAX_HOPS", "Refusal", "main", "node_identity"]

#: how many ``moved`` answers a hello follows (servers that followed the job's server)
MAX_HOPS = 8


class Refusal(Exception):
    """This node cannot take part: one line, the option at fault and what to do."""

    def __init__(self, message: str, *, variable: str | None = None,
                 value: str | None = None, hint: str = "", exit_code: int | None = None) -> None:
        super().__init__(message)
        self.payload: dict[str, Any] = {"error": message, "variable": variable, "value": value,
                                        "hint": hint}
        if exit_code is not None:  # the parent's own exit code for it (this node evicted)
            self.payload["exit_code"] = exit_code


def _evicted(why: str) -> Refusal:
    """This node was evicted (``--on-hang evict``): the parent ends with
    :data:`unirank.exitcodes.EVICTED`."""
    return Refusal(why, hint="the other nodes go on without this one (--on-hang evict); see "
                   "the hang report on rank 0's node", exit_code=EVICTED)


def _endpoint(spec: RdzvSpec) -> str:
    return f"{spec.endpoint_host}:{spec.endpoint_port}"


def node_identity() -> str:
    """This node's identity in the rendezvous: host, the ``unirank run`` parent's pid and a
    random part (as torchrun's agents: several on one host are several nodes)."""
    return f"{socket.gethostname()}:{os.getppid()}:{secrets.token_hex(4)}"


def serve_if_endpoint(spec: RdzvSpec, host: str) -> Server | None:
    """Serve the rendezvous here where this node is on the endpoint's host and the port is free;
    the server, or None (``host``: this node's identity)."""
    endpoint = _endpoint_socket(spec)
    if endpoint is None:
        return None
    from unirank.supervisor.rdzv.server import Server

    server = Server([endpoint], spec, host)
    server.start()
    return server


def _endpoint_socket(spec: RdzvSpec) -> socket.socket | None:
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


def connect(spec: RdzvSpec, address: tuple[str, int], deadline: float) -> Lines:
    """A connection to the rendezvous at ``address``, tried until ``deadline`` (the endpoint's
    node may start after this one)."""
    while True:
        try:
            return Lines(socket.create_connection(address, timeout=2))
        except OSError:
            if time.monotonic() >= deadline:
                raise Refusal(
                    f"nothing serves the rendezvous at {address[0]}:{address[1]}",
                    variable="--rdzv-endpoint", value=_endpoint(spec),
                    hint="start unirank run on the endpoint's host too (its node serves the "
                    "rendezvous), or give --rdzv-endpoint one of the nodes' addresses") from None
            time.sleep(0.2)


class Node:
    """This node's side of the rendezvous: hello, join, beats, news, and taking the rendezvous
    over where the node serving it is lost (see the module)."""

    def __init__(self, spec: RdzvSpec, node: str, local: Server | None) -> None:
        from unirank.supervisor.listen import open_store_socket

        self.spec, self.node, self.serves = spec, node, local is not None
        #: the server this process runs (at the endpoint, or as the successor)
        self.local = local
        self.explicit = spec.local_addr if spec.explicit_addr else None
        #: where this node serves the rendezvous, should it take it over
        self.spare = open_store_socket(0, host=spec.master_addr(), option="--local-addr")
        self.lines = connect(spec, (spec.endpoint_host, spec.endpoint_port),
                             time.monotonic() + spec.join_timeout)
        self.selector = selectors.DefaultSelector()
        self.joining = self.told = False
        self.deadline = self.heard = time.monotonic()
        #: the last round: its number, members (in order), records and the node serving it
        self.round, self.server = -1, ""
        self.members: tuple[str, ...] = ()
        self.records: dict[str, dict[str, Any]] = {}

    def hello(self, deadline: float, hops: int = 0) -> None:
        """Say who this node is; where the server answers ``moved`` (it followed the job's
        running server, :func:`.rounds.follows`), say it there (at most :data:`MAX_HOPS`
        times)."""
        if hops > MAX_HOPS:
            raise Refusal(f"the rendezvous at {_endpoint(self.spec)} sent this node on more "
                          f"than {MAX_HOPS} times", hint="run again; if it repeats, report it")
        self.lines.send({"op": "hello", "job": self.spec.run_id, "node": self.node,
                         "name": self.spec.node_name, "explicit": self.explicit,
                         "pid": os.getppid()})
        while True:
            for message in self._wait(deadline, "the rendezvous's answer"):
                if "moved" in message:
                    self._reconnect(message["moved"], deadline)
                    self.hello(deadline, hops + 1)
                    return
                if "evicted" in message:
                    raise _evicted(str(message["evicted"]))
                if "error" in message:
                    raise Refusal(str(message["error"]), variable=message.get("variable"),
                                  value=message.get("value"), hint=str(message.get("hint")))
                if message.get("ok"):
                    self.heard = time.monotonic()
                    self._learn(message)
                    return

    def _learn(self, state: dict[str, Any]) -> None:
        """The last round and its server, from the hello's answer: a node waiting to join
        (in no round yet) follows the rendezvous to the same successor as the members."""
        if state.get("members") and state.get("server"):
            self.members = tuple(state["members"])
            self.records = {m: r for m, r in zip(self.members, state.get("records") or ())}
            self.server = str(state["server"])

    def _wait(self, deadline: float, what: str) -> list[dict[str, Any]]:
        left = deadline - time.monotonic()
        with selectors.DefaultSelector() as selector:
            selector.register(self.lines.sock, selectors.EVENT_READ)
            if left <= 0 or not selector.select(left):
                raise Refusal(f"no answer from the rendezvous at {_endpoint(self.spec)} "
                              f"({what})", hint="run again; if it repeats, check the endpoint")
        messages = self.lines.receive()
        if messages is None:
            raise Refusal(f"the rendezvous at {_endpoint(self.spec)} closed its connection",
                          hint="its node ended: start the job again")
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

    def _reconnect(self, there: dict[str, Any], deadline: float) -> None:
        """Leave the server that followed another and connect to that one."""
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.lines.sock)
        self.lines.close()
        self.serves = False
        self.lines = connect(self.spec, (str(there["addr"]), int(there["port"])), deadline)

    def follow(self, there: dict[str, Any]) -> None:
        """The server here followed the job's running server: join that one (at its next
        round; the workers of a round run here are stopped first)."""
        wait = 2 * self.spec.keep_alive_interval * self.spec.keep_alive_max_attempt + 2.0
        self._reconnect(there, time.monotonic() + wait)
        self.hello(time.monotonic() + wait)
        self._rejoin(f"store moved to node {there.get('name')} ({there['addr']}): the job "
                     "runs there")

    def _rejoin(self, news: str) -> None:
        """After a new connection: watch it, join again if this node was joining, tell."""
        self.selector.register(self.lines.sock, selectors.EVENT_READ, "store")
        self.heard = time.monotonic()
        if self.joining:
            self.join()
        self._tell(news, always=True)

    def on_message(self, message: dict[str, Any]) -> None:
        if "moved" in message:
            self.follow(message["moved"])
            return
        if "evicted" in message:  # said now (the parent reads it while its workers run)
            raise _evicted(str(message["evicted"]))
        if "error" in message:
            raise Refusal(str(message["error"]), variable=message.get("variable"),
                          value=message.get("value"), hint=str(message.get("hint")))
        if "round" in message and self.joining:
            self.round, self.members = int(message["round"]), tuple(message["members"])
            self.records = {m: r for m, r in zip(self.members, message["records"])}
            self.server = str(message.get("server") or "")
            records = [NodeRecord(**r) for r in message["records"]]
            _answer(assign(records, self.members.index(self.node), self.round))
            self.joining = False
        elif "event" in message:  # nodes waiting to join too: admitted at any budget
            kind = message.get("kind")
            self._tell(str(message["event"]), always=kind == "wait",
                       kind=kind if isinstance(kind, str) else None)

    def _tell(self, news: str, *, always: bool = False, kind: str | None = None) -> None:
        """Pass news on to the parent, once per round, while the workers run (``always``:
        also while it waits for a round, which then only says it), with its ``kind`` where the
        server gave one (``join``: a change of membership, which spends no restart)."""
        payload = {"event": news, **({"kind": kind} if kind else {})}
        if always and self.joining:
            _answer(payload)
        elif not self.joining and not self.told:
            _answer(payload)
            self.told = True

    def move(self) -> None:
        """The node serving the rendezvous is lost: find its successor (or become it) by
        :func:`~.rounds.successor` over the last round's members, connect, and go on."""
        from unirank.supervisor.rdzv.rounds import successor

        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.lines.sock)
        self.lines.close()
        failed = {self.server}
        wait = 2 * self.spec.keep_alive_interval * self.spec.keep_alive_max_attempt + 2.0
        while True:
            chosen = successor(self.members, failed) if self.server else None
            if chosen is None:
                raise Refusal(f"the rendezvous at {_endpoint(self.spec)} ended (its node "
                              "ended) and no node of the last round serves it",
                              hint="start the job again")
            record = self.records[chosen]
            if chosen == self.node:
                self._take_over(frozenset(failed), record)
            address = (str(record["addr"]), int(record["rdzv_port"]))
            try:
                self.lines = connect(self.spec, address, time.monotonic() + wait)
                self.hello(time.monotonic() + wait)
                break
            except Refusal:
                failed.add(chosen)
        self.server = chosen
        from unirank.supervisor.rdzv.names import node_label, of_records

        label = node_label(chosen, of_records(self.records.values()), address=True)
        self._rejoin(f"store moved to node {label}")

    def _take_over(self, failed: frozenset[str], record: dict[str, Any]) -> None:
        """Serve the rendezvous here, resumed from the last round (this node is the
        successor); a server this process ran at the endpoint (one that followed the job
        here) now sends the nodes that reach it to this one."""
        from unirank.supervisor.rdzv.server import Resume, Server

        listening = [self.spare, *filter(None, [_endpoint_socket(self.spec)])]
        server = Server(listening, self.spec, self.node,
                        Resume(self.round, self.members, self.records, failed))
        server.start()
        if self.local is not None and self.local.moved is not None:
            self.local.moved = {"job": self.spec.run_id, "round": self.round,
                                "server": self.node, "addr": record["addr"],
                                "port": record["rdzv_port"], "name": record["name"]}
        self.local, self.serves = server, True

    def run(self) -> None:
        """Join, then serve the parent until its stdin ends."""
        self.selector.register(0, selectors.EVENT_READ, "parent")
        self.selector.register(self.lines.sock, selectors.EVENT_READ, "store")
        self.join()
        beat_at = 0.0
        lost_after = self.spec.keep_alive_interval * self.spec.keep_alive_max_attempt
        while True:
            now = time.monotonic()
            if now - beat_at >= self.spec.keep_alive_interval:
                beat_at = now
                self.lines.send({"op": "beat"})
            if self.joining and now >= self.deadline:
                raise Refusal(
                    f"the rendezvous {self.spec.run_id!r} at {_endpoint(self.spec)} did "
                    f"not complete within join_timeout={self.spec.join_timeout:g} s "
                    f"(fewer than {counted(self.spec.min_nodes, 'node')} joined)",
                    hint="start unirank run with the same --rdzv-endpoint and --rdzv-id "
                    "on the other nodes, or raise --rdzv-conf join_timeout")
            if now - self.heard >= lost_after and self.server != self.node:
                self.move()  # the node serving it is silent: hung, or cut off
            for key, _ in self.selector.select(min(0.5, self.spec.keep_alive_interval / 2)):
                if key.data == "parent":
                    if not self._from_parent():
                        return
                else:
                    self._from_store()

    def _from_parent(self) -> bool:
        """The parent's ``{"next": true, "evict": [...], "why": ...}``, or its end."""
        line = os.read(0, 65536)
        if not line.strip():
            self.lines.send({"op": "leave"})
            return False
        with contextlib.suppress(ValueError, AttributeError):
            order = json.loads(line.splitlines()[-1])
            if order.get("evict"):
                self.lines.send({"op": "evict", "nodes": order["evict"], "why": order["why"]})
        self.join()
        return True

    def _from_store(self) -> None:
        messages = self.lines.receive()
        if messages is None:
            self.move()
            return
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
    node.hello(time.monotonic() + min(spec.join_timeout, 30.0))
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
