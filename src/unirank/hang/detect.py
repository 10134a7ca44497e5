"""Is the job hung, and where (pure): every rank's progress record in, the hangs out.

A hang, in one process group: some rank has waited in the group's collective number ``n``
(entered, not finished) for at least the report delay (no rank can have progressed since:
every collective needs it), and the ranks are not all in that same call. The others are:

* *laggards*: their last entered collective is older, they have no record for the group,
  their program ended, or they sent no record at all;
* *ahead*: they left number ``n`` (gloo hands a rank a result even when its peer called
  another shape) and are in a later collective, compute, or ended;
* *mismatched*: the earliest collective number where the ranks' recorded ops or tensors
  differ (each record lists the group's last collectives), whatever the number the ranks
  wait at.

Ranks that all compute (no one waiting), or all wait in the same call, are no hang: there is
no rank to blame. :func:`blame` says which ranks a hang is blamed on and why, and so which of
them ``--on-hang evict`` leaves out (:attr:`Blame.stuck`, through :func:`verdict`): one choice
for the report, the ending and the eviction.

Reads no environment variable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["AHEAD", "ENDED", "MISMATCH", "NOT_ENTERED", "Ahead", "Blame", "Call", "Hang",
           "Laggard", "Uneven", "blame", "blamed", "cannot_return", "find_hangs", "find_uneven",
           "verdict", "waited_in"]

#: why a hang is blamed on its ranks (:attr:`Blame.kind`): they called another op or shape
MISMATCH = "mismatch"
#: ... they have not entered the collective the others wait in, and their program runs
NOT_ENTERED = "not entered"
#: ... they have not entered it, and their program ended
ENDED = "ended"
#: ... they left it (gloo gave them a result) and went on
AHEAD = "ahead"


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
class Ahead:
    """A rank that left the collective the others wait in: where it is now."""

    rank: int
    #: its last entered collective number, and the call it waits in now (None: it does not)
    last: int
    now: Call | None = None
    where: str = ""
    finished: bool = False


@dataclass(frozen=True)
class Hang:
    """One group's hang: the wavefront (who waits where, who has not come, who went on), and
    the earliest mismatch."""

    pg: str
    seq: int
    #: the ranks waiting, by call (the largest first)
    waiting: tuple[Call, ...]
    laggards: tuple[Laggard, ...]
    #: the calls at the mismatch's number that differ from ``matched`` (op, dtype, shape)
    mismatched: tuple[Call, ...]
    #: the longest wait, seconds
    waited: float
    nodes: Mapping[int, str]
    ahead: tuple[Ahead, ...] = ()
    #: the largest call at the mismatch's number (ties: the one with the lowest rank)
    matched: tuple[Call, ...] = ()


def _waited(record: Mapping[str, Any], group: Mapping[str, Any], now: float) -> float | None:
    """Seconds this rank has waited in its last entered collective; None if it finished it."""
    if group["entered"] <= group["done"] or group.get("since") is None:
        return None
    published = float(record["time"])
    return max(0.0, published - float(group["since"])) + max(0.0, now - published)


def waited_in(record: Mapping[str, Any], group: Mapping[str, Any], now: float) -> float | None:
    """Seconds ``record``'s rank has waited in ``group``'s last entered collective at wall
    clock ``now`` (the rule :func:`find_hangs` uses); None if it finished it."""
    return _waited(record, group, now)


def _groups(records: Mapping[int, Mapping[str, Any] | None]) -> dict[str, list[int] | None]:
    groups: dict[str, list[int] | None] = {}
    for record in records.values():
        for group in (record or {}).get("groups", ()):
            groups.setdefault(group["pg"], group.get("ranks"))
    return groups


#: ops whose ranks legitimately give tensors of different shapes (root and others, splits)
_SHAPES_MAY_DIFFER = ("scatter", "alltoall", "all_to_all")


def _history(group: Mapping[str, Any]) -> dict[int, tuple[str, str, str]]:
    """A rank's recorded collectives of one group: number -> (op, tensors, site)."""
    calls: dict[int, tuple[str, str, str]] = {}
    for seq, op, what, site in group.get("calls", ()):
        calls[int(seq)] = (str(op), str(what), str(site))
    if group.get("op"):
        known = calls.get(group["entered"], ("", "", ""))
        calls[group["entered"]] = (group["op"], group.get("what", ""),
                                   known[2] or group.get("site", ""))
    return calls


def _same(a: tuple[str, str, str], b: tuple[str, str, str]) -> bool:
    if a[0] != b[0]:
        return False
    return a[1] == b[1] or any(name in a[0] for name in _SHAPES_MAY_DIFFER)


def _calls_at(seq: int, entries: Mapping[int, tuple[str, str, str]],
              waits: Mapping[int, float | None]) -> list[Call]:
    """Ranks' entries at one number grouped by (op, tensors), the largest group first (ties:
    the group with the lowest rank)."""
    groups: list[tuple[tuple[str, str, str], list[int]]] = []
    for rank, entry in sorted(entries.items()):
        for first, ranks in groups:
            if _same(first, entry):
                ranks.append(rank)
                break
        else:
            groups.append((entry, [rank]))
    calls = []
    for (op, what, site), ranks in groups:
        site = site or next((entries[r][2] for r in ranks if entries[r][2]), "")
        found = [w for r in ranks if (w := waits.get(r)) is not None]
        calls.append(Call(tuple(ranks), op, seq, what, site, max(found) if found else None))
    calls.sort(key=lambda c: (-len(c.ranks), c.ranks))
    return calls


def _first_mismatch(histories: Mapping[int, Mapping[int, tuple[str, str, str]]],
                    waits: Mapping[int, float | None], seq: int
                    ) -> tuple[Call, ...] | None:
    """The calls at the earliest number where two ranks' recorded calls differ, largest
    first; None when all agree. A rank's wait counts at its own wait's number ``seq``."""
    numbers = sorted({n for calls in histories.values() for n in calls})
    for number in numbers:
        entries = {r: calls[number] for r, calls in histories.items() if number in calls}
        if len(entries) < 2:
            continue
        calls = _calls_at(number, entries, waits if number == seq else {})
        if len(calls) > 1:
            return tuple(calls)
    return None


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
    histories = {r: _history(g) for r, g in mine.items()}
    # waiting at ``seq``: its last entered, or a later one queued behind it (NCCL enqueues
    # ahead: a rank that has not finished ``seq`` has not left it)
    there = {r: waits[r] for r, g in mine.items() if waits[r] is not None and (
        g["entered"] == seq or (g["entered"] > seq and g["done"] < seq))}
    queued = {r for r in there if mine[r]["entered"] > seq and seq not in histories[r]}
    there = {r: w for r, w in there.items() if r not in queued}  # its call there is unknown
    waiting = _calls_at(seq, {r: histories[r].get(seq, ("", "", "")) for r in there}, there)
    mismatch = _first_mismatch(histories, there, seq)
    laggards = tuple(_laggard(r, records.get(r), mine.get(r), now)
                     for r in members if r not in mine or mine[r]["entered"] < seq)
    ahead = tuple(_ahead(r, records.get(r) or {}, mine[r], waits[r]) for r in members
                  if r in mine and r not in there and r not in queued
                  and mine[r]["entered"] >= seq)
    if not laggards and not ahead and mismatch is None:
        return None
    matched, mismatched = (mismatch[:1], mismatch[1:]) if mismatch else ((), ())
    if mismatch and mismatch[0].seq == seq:  # the wavefront shows the matching waiters
        kept = [c for c in waiting if any(_same((c.op, c.what, ""), (m.op, m.what, ""))
                                          for m in matched)]
        waiting = kept or waiting
    nodes = {r: str((records.get(r) or {}).get("node", "")) for r in members}
    waited = max(c.waited or 0.0 for c in waiting)
    return Hang(pg, seq, tuple(waiting), laggards, mismatched, waited, nodes, ahead, matched)


def _laggard(rank: int, record: Mapping[str, Any] | None, group: Mapping[str, Any] | None,
             now: float) -> Laggard:
    if record is None:
        return Laggard(rank, "", None, silent_for=None)
    return Laggard(rank, str(record.get("node", "")), None if group is None else group["entered"],
                   str(record.get("where", "")), bool(record.get("finished")),
                   max(0.0, now - float(record["time"])))


def _ahead(rank: int, record: Mapping[str, Any], group: Mapping[str, Any],
           waited: float | None) -> Ahead:
    now = None
    if waited is not None:
        now = Call((rank,), group.get("op", "") or "collective", group["entered"],
                   group.get("what", ""), group.get("site", ""), waited)
    return Ahead(rank, group["entered"], now, str(record.get("where", "")),
                 bool(record.get("finished")))


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


@dataclass(frozen=True)
class Blame:
    """The ranks a hang is blamed on, and why (:data:`MISMATCH`, :data:`NOT_ENTERED`,
    :data:`ENDED`, :data:`AHEAD`)."""

    ranks: tuple[int, ...]
    kind: str

    @property
    def stuck(self) -> tuple[int, ...]:
        """The ranks ``--on-hang evict`` leaves out (their nodes): blamed ranks that never
        entered the collective while their program runs. None in any other hang: in a
        mismatch no rank is stuck (every rank waits), and a program that ended or went on
        past the collective would hang the same way at the next round."""
        return self.ranks if self.kind == NOT_ENTERED else ()


def blame(hang: Hang) -> Blame:
    """Whom a hang is blamed on: the ranks that called another op or shape at the earliest
    mismatch, else those that have not entered the collective (the ones still running
    before those whose program ended), else those that left it."""
    if hang.mismatched:
        return Blame(tuple(sorted(r for c in hang.mismatched for r in c.ranks)), MISMATCH)
    running = tuple(lag.rank for lag in hang.laggards if not lag.finished)
    if running:
        return Blame(running, NOT_ENTERED)
    if hang.laggards:
        return Blame(tuple(lag.rank for lag in hang.laggards), ENDED)
    return Blame(tuple(a.rank for a in hang.ahead), AHEAD)


def blamed(hang: Hang) -> tuple[int, ...]:
    """The ranks a hang is blamed on (:func:`blame`)."""
    return blame(hang).ranks


@dataclass(frozen=True)
class Uneven:
    """Ranks that ended their program after fewer collectives than ``call``'s number: the
    ranks ran different numbers of collectives (a rank skipped one)."""

    pg: str
    #: (rank, its last collective number) of each rank whose program ended before
    ended: tuple[tuple[int, int], ...]
    call: Call
    #: the earliest collective whose ops or shapes differ, where the records show one
    mismatch: tuple[Call, ...] = ()


def find_uneven(records: Mapping[int, Mapping[str, Any] | None], rank: int) -> Uneven | None:
    """Whether ``rank``'s last collective (its record now, after it failed in it) is one
    that ranks whose program ended never called; None otherwise."""
    own = records.get(rank) or {}
    for group in own.get("groups", ()):
        ended = []
        histories = {rank: _history(group)}
        for other, record in sorted(records.items()):
            if other == rank or not record or not record.get("finished"):
                continue
            for theirs in record.get("groups", ()):
                if theirs["pg"] == group["pg"] and theirs["entered"] < group["entered"]:
                    ended.append((other, int(theirs["entered"])))
                    histories[other] = _history(theirs)
        if ended:
            call = Call((rank,), group.get("op") or "collective", group["entered"],
                        group.get("what", ""), group.get("site", ""))
            return Uneven(group["pg"], tuple(ended), call,
                          _first_mismatch(histories, {}, -1) or ())
    return None


def cannot_return(hangs: Sequence[Hang]) -> bool:
    """Whether ranks wait in collectives none of them can ever return from: at one number of a
    group, the ranks called different ops or shapes (a stop's SIGTERM then cannot end them:
    their handlers wait for the collective to return)."""
    return any(blame(hang).kind == MISMATCH for hang in hangs)


def verdict(hang: Hang) -> dict[str, Any]:
    """What ``--on-hang evict`` needs of a hang, from its :func:`blame`: the ranks to leave
    out (``never_entered``: :attr:`Blame.stuck`, none where no rank is stuck), the collective
    the others wait in (``call``: ``all_reduce #12``), and whom the hang is blamed on and why
    (``blamed``, ``blame``), for the line that says there is nothing to evict."""
    found = blame(hang)
    first = hang.waiting[0] if hang.waiting else None
    return {"never_entered": sorted(found.stuck), "call": f"{first.op} #{first.seq}" if first
            else "", "blamed": list(found.ranks), "blame": found.kind}
