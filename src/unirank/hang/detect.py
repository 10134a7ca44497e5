"""Is the job hung, and where (pure): every rank's progress record in, the hangs out.

A hang, in one process group: some ranks have waited in the group's collective number ``n``
(entered, not finished) for at least the report delay, while others have not entered it
(their last entered collective is older, they have no record for the group, their program
ended, or they sent no record at all), or entered another op, dtype or shape as number ``n``
(a mismatch). Ranks that all compute (no one waiting), or all wait in the same collective,
are no hang: there is no rank to blame.

Reads no environment variable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Call", "Hang", "Laggard", "find_hangs"]


@dataclass(frozen=True)
class Call:
    """Ranks that entered the same collective: op, sequence number, tensors, call site."""

    ranks: tuple[int, ...]
    op: str
    seq: int
    what: str = ""
    site: str = ""
    #: the longest any of these ranks has waited in it (seconds); None: they finished it
    waited: float | None = None


@dataclass(frozen=True)
class Laggard:
    """A rank that has not entered the collective the others wait in, and where it is."""

    rank: int
    node: str
    #: ``last``: its last entered collective number; None when it has none in this group
    last: int | None
    #: its main thread's place in the user's code (``save (train.py:80)``), "" if unknown
    where: str = ""
    finished: bool = False
    #: seconds since its last record (None: it sent none)
    silent_for: float | None = 0.0


@dataclass(frozen=True)
class Hang:
    """One group's hang: the wavefront (who waits where, who has not come), and mismatches."""

    pg: str
    seq: int
    #: the ranks waiting, by call (the largest first)
    waiting: tuple[Call, ...]
    laggards: tuple[Laggard, ...]
    #: calls at the same number that differ from the first of ``waiting`` (op, dtype, shape)
    mismatched: tuple[Call, ...]
    #: the longest wait, seconds
    waited: float
    nodes: Mapping[int, str]


def _waited(record: Mapping[str, Any], group: Mapping[str, Any], now: float) -> float | None:
    """Seconds this rank has waited in its last entered collective; None if it finished it."""
    if group["entered"] <= group["done"] or group.get("since") is None:
        return None
    published = float(record["time"])
    return max(0.0, published - float(group["since"])) + max(0.0, now - published)


def _groups(records: Mapping[int, Mapping[str, Any] | None]) -> dict[str, list[int] | None]:
    groups: dict[str, list[int] | None] = {}
    for record in records.values():
        for group in (record or {}).get("groups", ()):
            groups.setdefault(group["pg"], group.get("ranks"))
    return groups


def _calls(entries: list[tuple[int, Mapping[str, Any], float | None]]) -> list[Call]:
    """Entries at one number grouped by (op, tensors, site), the largest group first."""
    by_call: dict[tuple[str, str, str], list[tuple[int, float | None]]] = {}
    for rank, group, waited in entries:
        key = (group.get("op", ""), group.get("what", ""), group.get("site", ""))
        by_call.setdefault(key, []).append((rank, waited))
    calls = []
    for (op, what, site), ranks in by_call.items():
        waits = [w for _, w in ranks if w is not None]
        calls.append(Call(tuple(sorted(r for r, _ in ranks)), op, entries[0][1]["entered"],
                          what, site, max(waits) if waits else None))
    calls.sort(key=lambda c: (-len(c.ranks), c.ranks))
    return calls


def _hang_in(pg: str, members: list[int], records: Mapping[int, Mapping[str, Any] | None],
             report_after: float, now: float) -> Hang | None:
    """The hang of group ``pg`` (see the module docstring), or None."""
    mine: dict[int, Mapping[str, Any]] = {}
    for rank in members:
        for group in (records.get(rank) or {}).get("groups", ()):
            if group["pg"] == pg:
                mine[rank] = group
    waits = {r: _waited(records[r] or {}, g, now) for r, g in mine.items()}
    long_waits = [mine[r]["entered"] for r, w in waits.items()
                  if w is not None and w >= report_after]
    if not long_waits:
        return None
    seq = min(long_waits)
    at_seq = [(r, g, waits[r]) for r, g in sorted(mine.items()) if g["entered"] == seq]
    calls = _calls(at_seq)
    waiting = tuple(c for c in calls if c.waited is not None)
    first = waiting[0]
    # a rank that finished number n has no entry read (``op`` unknown): not a mismatch
    mismatched = tuple(c for c in calls if c.op and (c.op, c.what) != (first.op, first.what))
    waiting = tuple(c for c in waiting if (c.op, c.what) == (first.op, first.what))
    laggards = tuple(_laggard(r, records.get(r), mine.get(r), now)
                     for r in members if r not in mine or mine[r]["entered"] < seq)
    if not laggards and not mismatched:
        return None
    nodes = {r: str((records.get(r) or {}).get("node", "")) for r in members}
    waited = max(c.waited or 0.0 for c in waiting)
    return Hang(pg, seq, waiting, laggards, mismatched, waited, nodes)


def _laggard(rank: int, record: Mapping[str, Any] | None, group: Mapping[str, Any] | None,
             now: float) -> Laggard:
    if record is None:
        return Laggard(rank, "", None, silent_for=None)
    return Laggard(rank, str(record.get("node", "")), None if group is None else group["entered"],
                   str(record.get("where", "")), bool(record.get("finished")),
                   max(0.0, now - float(record["time"])))


def find_hangs(records: Mapping[int, Mapping[str, Any] | None], world_size: int,
               report_after: float, now: float) -> list[Hang]:
    """Every group's hang (see the module docstring); ``records``: rank -> its record (None:
    it sent none), ``now``: the wall clock of the records' times."""
    hangs = []
    for pg, members in sorted(_groups(records).items()):
        hang = _hang_in(pg, list(members) if members else list(range(world_size)), records,
                        report_after, now)
        if hang is not None:
            hangs.append(hang)
    return hangs


def verdict(hang: Hang) -> dict[str, Any]:
    """What ``--on-hang evict`` needs of a hang: the ranks that never entered the collective
    the others wait in (not those that finished), and that collective (``all_reduce #12``)."""
    first = hang.waiting[0] if hang.waiting else None
    return {"never_entered": sorted(lag.rank for lag in hang.laggards if not lag.finished),
            "call": f"{first.op} #{first.seq}" if first else ""}
