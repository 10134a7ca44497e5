"""A round's members sent as a change against the round before (pure; no torch, no sockets;
reads no environment variable).

A round's message names its members in order and their records (:class:`~.spec.NodeRecord`);
every member needs them (its rank, the successor should the server be lost). Sent whole to
every member, a round of N nodes costs O(N^2) bytes: 3.5 GB at 4,096 nodes. A member that
holds the round before gets the change instead: the nodes that left, those that came (in the
order they came), the records that differ, and the serving node. It rebuilds the order by
:func:`.rounds.rebuilt`, the rule :func:`.rounds.members_of` orders by (the round before's
nodes that stay, in their order, then the new ones, the serving node first); the server sends
a change only where it gives its members exactly (:func:`change_of`), else the whole round. A
node that holds no round, or another one, gets the whole round (the server knows which round
each connection holds: :mod:`.server`).

Full: ``{"round", "members", "records", "server"}``. Change: ``{"round", "after", "base",
"gone", "came", "changed", "server", "size"}`` (``after``: the round it applies to; ``base``:
:func:`digest` of that round's members, which the node checks against those it holds;
``changed``: node -> record, for those that came and those whose record differs; ``size``: the
member count, a check).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from unirank.supervisor.rdzv.rounds import rebuilt

__all__ = ["BadChange", "change_of", "digest", "full_round", "read_round"]

Records = Mapping[str, dict[str, Any]]


class BadChange(ValueError):
    """A change that does not apply to the round this node holds (a server's error)."""


def digest(members: Sequence[str]) -> str:
    """A short digest of a round's members in order: a change applies only to the same."""
    return hashlib.sha256("\n".join(members).encode()).hexdigest()[:24]


def full_round(number: int, members: Sequence[str], records: Records,
               server: str) -> dict[str, Any]:
    """The whole round ``number``."""
    return {"round": number, "members": list(members),
            "records": [records[m] for m in members], "server": server}


def change_of(number: int, before: Sequence[str], before_records: Records,
              members: Sequence[str], records: Records, server: str) -> dict[str, Any] | None:
    """Round ``number`` as a change against the round before it (``before``, its records as
    sent); None where :func:`rebuilt` would not give ``members`` (then the whole round goes)."""
    was, now = frozenset(before), frozenset(members)
    gone = [n for n in before if n not in now]
    came = [n for n in members if n not in was]
    if rebuilt(before, gone, came, server) != tuple(members):
        return None
    changed = {m: records[m] for m in members
               if m not in was or before_records.get(m) != records[m]}
    return {"round": number, "after": number - 1, "base": digest(before), "gone": gone,
            "came": came, "changed": changed, "server": server, "size": len(members)}


def read_round(message: Mapping[str, Any], held: int, members: Sequence[str],
               records: Records) -> tuple[tuple[str, ...], dict[str, dict[str, Any]]]:
    """The members and records of the round in ``message``, whole or as a change against the
    round ``held`` (its ``members`` and ``records``); :class:`BadChange` where it does not
    apply."""
    if "members" in message:
        order = tuple(str(m) for m in message["members"])
        return order, dict(zip(order, message["records"]))
    if message.get("after") != held or message.get("base") != digest(members):
        raise BadChange(f"round {message.get('round')} came as a change against round "
                        f"{message.get('after')}, and this node holds "
                        f"{'another' if message.get('after') == held else 'round'} {held}")
    order = rebuilt(members, message["gone"], message["came"], str(message["server"]))
    changed = message["changed"]
    if len(order) != message.get("size") or any(m not in records and m not in changed
                                                for m in order):
        raise BadChange(f"round {message.get('round')}'s change does not rebuild its members")
    return order, {m: changed.get(m) or records[m] for m in order}
