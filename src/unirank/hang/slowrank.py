"""Stragglers while the job runs (pure): each look's progress records in, the ranks that keep
the others waiting now (and those that stopped) out, with the hysteresis that keeps one slow
step or a step's jitter from naming anyone.

A rank's *window* closes at a look where its newest record is :data:`~unirank.hang.view.
MIN_SPAN` seconds (2 s) or more newer than the one its window started with (each rank's span
on its own clock; no two machines' clocks are compared; with the default 5 s interval, a
window per look). Its share waiting is :func:`unirank.hang.view.share_of` (its seconds in
collectives over the window's seconds: ``unirank top``'s rule), and it kept the others
waiting in that window where :func:`unirank.hang.straggle.find_stragglers` names it among
every running rank's latest share: the median of the other ranks' shares exceeds its own by
more than :data:`~unirank.hang.straggle.STRAGGLER_MARGIN` (0.20). A window with a hang in it
(:func:`unirank.hang.detect.find_hangs`: the hang detector's business) is no window: the
streaks start again after it.

A rank is *named* once it kept the others waiting in :data:`MIN_WINDOWS` consecutive windows
or more that span :data:`NAME_SPAN` seconds together (with the detector's default 5 s
interval: two windows, named 10 to 20 s after a rank became slow); it *recovers* once it did
not in as many consecutive windows spanning as long. The margin said is the named streak's,
each window weighted by its span.

Reads no environment variable.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from unirank.hang.straggle import Straggler, find_stragglers
from unirank.hang.view import share_of
from unirank.storekeys.hang import STRAGGLERS_KEY

__all__ = ["MIN_WINDOWS", "NAME_SPAN", "Change", "Slow", "Streak", "change_line", "decode_named",
           "encode_named", "observe", "read_named"]

#: seconds of consecutive windows that name a rank (or say it recovered)
NAME_SPAN = 8.0
#: the fewest consecutive windows that name a rank (or say it recovered)
MIN_WINDOWS = 2


@dataclass(frozen=True)
class Streak:
    """A rank's run of consecutive windows alike: keeping the others waiting or not."""

    slow: bool
    windows: int = 0
    span: float = 0.0
    #: the sum of each window's margin times its span (``slow`` streaks)
    kept: float = 0.0

    def margin(self) -> float:
        """The streak's margin, each window weighted by its span."""
        return self.kept / self.span if self.span > 0 else 0.0

    def long(self) -> bool:
        """Whether the streak names (or clears) its rank."""
        return self.windows >= MIN_WINDOWS and self.span >= NAME_SPAN


@dataclass(frozen=True)
class Change:
    """A rank named (``slow``) or recovered, with the streak that decided it."""

    straggler: Straggler
    slow: bool
    span: float


@dataclass(frozen=True)
class Slow:
    """What the rule keeps between looks."""

    #: each rank's record at the start of the window now open
    start: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    streaks: Mapping[int, Streak] = field(default_factory=dict)
    #: the ranks named now
    named: Mapping[int, Straggler] = field(default_factory=dict)
    #: each rank's share waiting in its last window
    shares: Mapping[int, float] = field(default_factory=dict)


def _running(records: Mapping[int, Mapping[str, Any] | None]) -> dict[int, Mapping[str, Any]]:
    return {r: rec for r, rec in records.items() if rec is not None and not rec.get("finished")}


def _windows(state: Slow, running: Mapping[int, Mapping[str, Any]]
             ) -> tuple[dict[int, Mapping[str, Any]], dict[int, float], dict[int, float]]:
    """The window starts to keep, every running rank's latest share, and the spans of the
    ranks whose window closed at this look (:func:`unirank.hang.view.share_of`)."""
    start, shares, spans = dict(state.start), {}, {}
    for rank, record in running.items():
        begun = state.start.get(rank)
        share = share_of(begun, record) if begun is not None else None
        if begun is None or share is not None:
            start[rank] = record
        if begun is not None and share is not None:
            shares[rank] = share
            spans[rank] = float(record["time"]) - float(begun["time"])
        elif rank in state.shares:
            shares[rank] = state.shares[rank]
    return {r: start[r] for r in running}, shares, spans


def _extend(streak: Streak | None, slow: bool, span: float, margin: float) -> Streak:
    base = streak if streak is not None and streak.slow == slow else Streak(slow)
    return Streak(slow, base.windows + 1, base.span + span,
                  base.kept + (margin * span if slow else 0.0))


def observe(state: Slow, records: Mapping[int, Mapping[str, Any] | None], hung: bool
            ) -> tuple[Slow, list[Change]]:
    """One look: every rank's newest record (None: none yet), whether a hang is found now;
    the state to keep and the ranks named or recovered at this look (module docstring)."""
    running = _running(records)
    named = {r: s for r, s in state.named.items() if r in running}
    if hung:  # the hang detector's business: the windows start again after it
        return Slow(dict(running), {}, named), []
    start, shares, spans = _windows(state, running)
    if not spans or set(shares) != set(running):
        return Slow(start, state.streaks, named, shares), []
    nodes = {r: str(rec.get("node", "")) for r, rec in running.items()}
    slow = {s.rank: s for s in find_stragglers(shares, nodes)}
    streaks, changes = dict(state.streaks), []
    for rank in sorted(spans):
        margin = slow[rank].margin if rank in slow else 0.0
        streak = streaks[rank] = _extend(streaks.get(rank), rank in slow, spans[rank], margin)
        if streak.long() and streak.slow != (rank in named):
            who = Straggler(rank, nodes[rank], streak.margin() if streak.slow
                            else named[rank].margin)
            changes.append(Change(who, streak.slow, streak.span))
            if streak.slow:
                named[rank] = who
            else:
                del named[rank]
        elif streak.slow and rank in named:  # the margin said follows the streak
            named[rank] = replace(named[rank], margin=streak.margin())
    return Slow(start, {r: s for r, s in streaks.items() if r in running}, named, shares), \
        changes


def change_line(change: Change, prog: str = "unirank") -> str:
    """The console's line for one change: ``unirank: straggler: rank 3 (node2) keeps the
    others waiting 38 % of the time (last 15 s)``, or ``... no longer keeps the others
    waiting (last 10 s)``."""
    s = change.straggler
    who = f"rank {s.rank} ({s.node})" if s.node else f"rank {s.rank}"
    if change.slow:
        return (f"{prog}: straggler: {who} keeps the others waiting {100 * s.margin:.0f} % of "
                f"the time (last {change.span:.0f} s)\n")
    return (f"{prog}: straggler: {who} no longer keeps the others waiting "
            f"(last {change.span:.0f} s)\n")


def encode_named(state: Slow) -> str:
    """The ranks named now, as the detector keeps them in the store (JSON)."""
    return json.dumps([{"rank": s.rank, "node": s.node, "margin": round(s.margin, 4)}
                       for _, s in sorted(state.named.items())])


def decode_named(value: bytes | str) -> tuple[Straggler, ...]:
    """:func:`encode_named`'s value read back (``()`` where it is not one)."""
    try:
        items = json.loads(value)
        return tuple(Straggler(int(i["rank"]), str(i["node"]), float(i["margin"]))
                     for i in items)
    except (ValueError, TypeError, KeyError):
        return ()


def read_named(store: Any) -> tuple[Straggler, ...]:
    """The ranks named now, read from the job's ``store`` (one ``check``, one ``get``; called
    from the program's thread, beside the watcher's: a TCPStore serialises its calls); ``()``
    where none is kept or the store does not answer."""
    try:
        if store is None or not store.check([STRAGGLERS_KEY]):
            return ()
        return decode_named(bytes(store.get(STRAGGLERS_KEY)))
    except Exception:
        return ()
