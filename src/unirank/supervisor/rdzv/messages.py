"""The messages a node (or a successor's probe) sends the rendezvous's server, and their check
(pure; no torch, no sockets; reads no environment variable).

One home for what each ``op`` carries: :data:`REQUESTS` names every field, its type and
whether it may be left out. :func:`parse_request` turns one decoded JSON line into a
:class:`Request` or raises :class:`BadMessage` naming what is wrong; the server then closes
that connection only and says so in one line of the rendezvous's log (:mod:`.server`).
Nothing a peer sends reaches the server's decisions unchecked: a line longer than
:data:`MAX_LINE_IN` is refused by :class:`~.wire.Lines` before it is parsed.

Messages in: ``hello`` (job, node, name, explicit address, the last round it took part in and
the round whose members it holds), ``join`` (a :class:`~.spec.NodeRecord`), ``beat``,
``leave``, ``abandon``, ``evict``, ``redirect`` (a successor's probe: its job, round, node and
address). Out: ``ok``/``error`` (the hello's answer), ``round`` (number and the members'
records in order, or the change against the round before: :mod:`.change`; the hello's ``ok``
carries the last round's too where the node does not hold it, so that a node waiting to join
can follow the rendezvous to a successor), ``event`` (news, with its ``kind``: lost, restart,
join; ``wait`` to a node that waits for a running job's next round), ``beat``, ``moved``
(where the job runs: address, rendezvous port, node), ``dropped`` (why this node was left
out), ``here`` (a probe's answer), ``behind`` (this server's round, to a hello from a node that
took part in a later one: :func:`.rounds.behind`), ``spares`` (how many nodes wait beyond MAX,
and their ``names``, to the running round's members when they change:
:meth:`.keeper.RoundKeeper.say_spares`), ``slow_link`` (a line naming a node whose link is slow,
and that ``node``, "" once none is, to the running round's members:
:meth:`.keeper.RoundKeeper.say_slow_link`).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, fields
from typing import Any

from unirank.contract import RDZV_SECRET_FILE_VAR, RDZV_SECRET_VAR
from unirank.supervisor.rdzv.secret import tag
from unirank.supervisor.rdzv.spec import NodeRecord, RdzvSpec

__all__ = [
    "ENDED",
    "EVICTED",
    "FENCED",
    "HELLO_WITHIN",
    "JOIN",
    "LOST",
    "MAX_EVICT",
    "MAX_HELLO_LINE",
    "MAX_LINE_IN",
    "MAX_TEXT",
    "MAX_UNNAMED",
    "MOVED",
    "REQUESTS",
    "RESTART",
    "WAIT",
    "BadMessage",
    "Request",
    "authentic",
    "hello_refusal",
    "hello_tag",
    "other_job",
    "parse_request",
    "place_tag",
    "twice",
    "wrong_secret",
]

#: the kinds of a world change, as data: the server's news (a member ``LOST``, one asking for
#: a new ``RESTART``, nodes that ``JOIN``, a node that must ``WAIT`` for the job's next round),
#: the helper's own (``FENCED``: no word from its server; ``MOVED``: the rendezvous moved), and
#: the parent's reading of its helper (``EVICTED``: this node; ``ENDED``: the helper ended)
LOST, RESTART, JOIN, WAIT = "lost", "restart", "join", "wait"
FENCED, MOVED, EVICTED, ENDED = "fenced", "moved", "evicted", "ended"

#: the longest line the server reads from a node (an eviction naming every node of a job of
#: thousands fits), and from a connection that has not said hello yet
MAX_LINE_IN = 1 << 20
MAX_HELLO_LINE = 16 << 10
#: the longest text field (an id, a name, an address, a reason)
MAX_TEXT = 4096
#: the most nodes one eviction names
MAX_EVICT = 65536
#: the most connections that have not said hello yet (the oldest goes first), and how long one
#: may stay without it
MAX_UNNAMED = 1024
HELLO_WITHIN = 10.0

_TEXT, _INT, _BOOL, _NODES, _RECORD = "text", "int", "bool", "nodes", "record"
#: each op's fields: name -> (kind, required); a field may also be null where not required
REQUESTS: dict[str, dict[str, tuple[str, bool]]] = {
    "hello": {"job": (_TEXT, True), "node": (_TEXT, True), "name": (_TEXT, False),
              "explicit": (_TEXT, False), "pid": (_INT, False), "round": (_INT, False),
              "known": (_INT, False), "nonce": (_TEXT, False), "auth": (_TEXT, False),
              "token": (_TEXT, False)},
    "join": {"record": (_RECORD, True)},
    "beat": {},
    "leave": {},
    "abandon": {},
    "evict": {"nodes": (_NODES, True), "why": (_TEXT, False)},
    "redirect": {"job": (_TEXT, True), "round": (_INT, True), "server": (_TEXT, True),
                 "place": (_INT, False), "addr": (_TEXT, False), "port": (_INT, False),
                 "name": (_TEXT, False), "auth": (_TEXT, False)},
}
_RECORD_KINDS = {f.name: (_BOOL if f.type == "bool" else _INT if f.type == "int" else _TEXT)
                 for f in fields(NodeRecord)}
_RECORD_REQUIRED = ("addr", "name", "nproc", "store_port", "serves_endpoint")
#: a record's numbers a node's plan takes as given: ranks on the node, ports
_RECORD_RANGES = (("nproc", 1, 1 << 20), ("store_port", 0, 65535), ("rdzv_port", 0, 65535))


class BadMessage(ValueError):
    """A message the server does not take: what is wrong with it, in a few words."""


@dataclass(frozen=True)
class Request:
    """One checked message: its ``op`` and its fields (those left out absent)."""

    op: str
    fields: dict[str, Any]

    def get(self, name: str, default: Any = None) -> Any:
        value = self.fields.get(name)
        return default if value is None else value


def parse_request(message: object) -> Request:
    """``message`` (one decoded JSON line) as a :class:`Request`; :class:`BadMessage` where it
    is not an object, names no known ``op``, or a field is missing or of the wrong type or size
    (fields not listed are dropped)."""
    if not isinstance(message, dict):
        raise BadMessage("not a JSON object")
    op = message.get("op")
    spec = REQUESTS.get(op) if isinstance(op, str) else None
    if spec is None:
        raise BadMessage(f"unknown op {_short(op)}")
    checked: dict[str, Any] = {}
    for name, (kind, required) in spec.items():
        value = message.get(name)
        if value is None:
            if required:
                raise BadMessage(f"{op}: {name} missing")
            continue
        checked[name] = _checked(f"{op}: {name}", kind, value)
    return Request(str(op), checked)


def _checked(what: str, kind: str, value: Any) -> Any:
    if kind == _TEXT:
        if not isinstance(value, str) or len(value) > MAX_TEXT:
            raise BadMessage(f"{what} is not a text of at most {MAX_TEXT} characters")
        return value
    if kind == _INT:
        if isinstance(value, bool) or not isinstance(value, int) or abs(value) >= 1 << 62:
            raise BadMessage(f"{what} is not a whole number")
        return value
    if kind == _BOOL:
        if not isinstance(value, bool):
            raise BadMessage(f"{what} is not true or false")
        return value
    if kind == _NODES:
        if not isinstance(value, list) or len(value) > MAX_EVICT:
            raise BadMessage(f"{what} is not a list of at most {MAX_EVICT} nodes")
        return [_checked(what, _TEXT, node) for node in value]
    return _record(what, value)


def _record(what: str, value: Any) -> dict[str, Any]:
    """A node's record (:class:`~.spec.NodeRecord`'s fields and types; others dropped)."""
    if not isinstance(value, dict):
        raise BadMessage(f"{what} is not an object")
    missing = [name for name in _RECORD_REQUIRED if value.get(name) is None]
    if missing:
        raise BadMessage(f"{what}: {', '.join(missing)} missing")
    record = {name: _checked(f"{what}.{name}", kind, value[name])
              for name, kind in _RECORD_KINDS.items() if value.get(name) is not None}
    for name, low, high in _RECORD_RANGES:  # a record every other node can plan with
        if name in record and not low <= record[name] <= high:
            raise BadMessage(f"{what}.{name} {record[name]} is not in {low}..{high}")
    return record


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def other_job(spec: RdzvSpec, job: object) -> dict[str, Any]:
    """The refusal of a hello from a node of another job (``job``: its ``--rdzv-id``)."""
    return {"error": f"is not the job the rendezvous at {spec.endpoint_host}:"
                     f"{spec.endpoint_port} serves, {spec.run_id!r}",
            "variable": "--rdzv-id", "value": job,
            "hint": "give every node of one job the same --rdzv-id, and each job its own "
                    "--rdzv-endpoint"}


def twice(spec: RdzvSpec, explicit: str, pid: int, name: str) -> dict[str, Any]:
    """The refusal of a hello with the ``--local-addr`` of a node already in the job (its
    ``unirank run``'s ``pid`` on ``name``)."""
    return {"error": f"this node already takes part in the rendezvous {spec.run_id!r} at "
                     f"{spec.endpoint_host}:{spec.endpoint_port} (unirank run pid {pid} on "
                     f"{name})",
            "variable": "--local-addr", "value": explicit,
            "hint": "a node joins a job once: end the other unirank run, or give this one "
                    "another --local-addr (or another --rdzv-id for another job)"}


def wrong_secret(spec: RdzvSpec, given: bool) -> dict[str, Any]:
    """The refusal of a hello without the job's secret (``given``: it had one, not the
    job's), or with one where the job has none; the secret itself is never named."""
    where = f"the rendezvous {spec.run_id!r} at {spec.endpoint_host}:{spec.endpoint_port}"
    if not spec.secret:
        error = f"this node has a rendezvous secret ({RDZV_SECRET_VAR}) and {where} has none"
    elif given:
        error = f"this node's rendezvous secret ({RDZV_SECRET_VAR}) is not the one of {where}"
    else:
        error = f"this node has no rendezvous secret ({RDZV_SECRET_VAR}) and {where} has one"
    return {"error": error, "hint": f"give every node of one job the same {RDZV_SECRET_VAR} "
                                    f"or {RDZV_SECRET_FILE_VAR} (or none to all)"}


def hello_tag(spec: RdzvSpec, side: str, node: str, nonce: object) -> str:
    """The tag of a hello (``side`` ``hello``) or of its answer (``ok``) under the job's
    secret: its job, the node's identity and the node's nonce."""
    return tag(spec.secret, side, spec.run_id, node, nonce)


def place_tag(spec: RdzvSpec, side: str, state: dict[str, Any]) -> str:
    """The tag of a probe (``side`` ``redirect``) or its answer (``here``): where a server of
    the job says it runs."""
    return tag(spec.secret, side, spec.run_id, state.get("round"), state.get("server"),
               state.get("addr"), state.get("port"))


def hello_refusal(spec: RdzvSpec, hello: dict[str, Any]) -> dict[str, Any] | None:
    """Why a checked hello is refused for its secret (None: it is not)."""
    given = hello.get("auth")
    if not spec.secret:
        return wrong_secret(spec, True) if given else None
    if authentic(given, hello_tag(spec, "hello", hello["node"], hello.get("nonce"))):
        return None
    return wrong_secret(spec, given is not None)


def authentic(given: object, expected: str) -> bool:
    """Whether the tag ``given`` is ``expected`` (in constant time)."""
    return isinstance(given, str) and hmac.compare_digest(given, expected)
