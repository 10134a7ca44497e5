"""Stragglers (pure): every rank's time in collectives at the end of a run in, the ranks that
kept the others waiting and the block ``unirank run`` prints out.

Each rank measured its own time in collectives and its collective activity's length
(:mod:`.waits`); clocks are never compared across ranks. The rule (:func:`find_stragglers`):
rank r *kept the others waiting* when the median of the other ranks' fractions of time in
collectives exceeds r's own fraction by more than :data:`STRAGGLER_MARGIN` (0.20): the others
sat in collectives, waiting for it, while it computed. The margin is how much of the time it
kept them waiting. With two ranks the other rank's fraction is the median: the one that waits
far less is named (it cannot be both); with one rank nothing is named. When most ranks are
slow, the median is a slow rank's and nobody is named.

A run is long enough to say anything (:func:`long_enough`) when the median rank's activity
lasted two of the detector's intervals (10 s with the default settings) and at least
:data:`MIN_SECONDS`; shorter runs (a 1 s hello) print nothing.

Reads no environment variable.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from unirank.hang.waits import SAMPLE_PERIOD

__all__ = ["MIN_SECONDS", "STRAGGLER_MARGIN", "Straggler", "collective_rows",
           "find_stragglers", "long_enough", "render_block"]

#: how far below the others' median fraction a rank's fraction must be to be named
STRAGGLER_MARGIN = 0.20
#: the shortest collective activity (seconds, the median rank's) worth a block
MIN_SECONDS = 2.0
#: up to this many ranks the block has a line per rank; above, one line of min/median/max
PER_RANK_LINES = 8


@dataclass(frozen=True)
class Straggler:
    """A rank that kept the others waiting ``margin`` (a fraction) of the time."""

    rank: int
    node: str
    margin: float


def _fraction(record: Mapping[str, Any]) -> float:
    waits = record["collectives"]
    return float(waits["in_s"]) / float(waits["wall_s"]) if waits["wall_s"] else 0.0


def measured(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records that carry a time in collectives, by rank."""
    return sorted((r for r in records if isinstance(r.get("collectives"), Mapping)),
                  key=lambda r: int(r["rank"]))


def long_enough(records: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the run's collective activity lasted long enough (module docstring)."""
    ranks = measured(records)
    if not ranks:
        return False
    wall = statistics.median(float(r["collectives"]["wall_s"]) for r in ranks)
    interval = max(float(r["collectives"].get("interval", 0.0)) for r in ranks)
    return wall >= max(2 * interval, MIN_SECONDS)


def find_stragglers(fractions: Mapping[int, float], nodes: Mapping[int, str] | None = None,
                    margin: float = STRAGGLER_MARGIN) -> list[Straggler]:
    """The ranks whose fraction of time in collectives is more than ``margin`` below the
    median of the other ranks' (the rule of the module docstring), the largest margin first."""
    found = []
    for rank, own in fractions.items():
        others = [f for r, f in fractions.items() if r != rank]
        if others and statistics.median(others) - own > margin:
            found.append(Straggler(rank, (nodes or {}).get(rank, ""),
                                   statistics.median(others) - own))
    return sorted(found, key=lambda s: (-s.margin, s.rank))


def stragglers_of(records: Sequence[Mapping[str, Any]]) -> list[Straggler]:
    """:func:`find_stragglers` over the end-of-run records."""
    ranks = measured(records)
    return find_stragglers({int(r["rank"]): _fraction(r) for r in ranks},
                           {int(r["rank"]): str(r.get("node", "")) for r in ranks})


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.0f} %"


def _who(rank: int, node: str) -> str:
    return f"rank {rank} ({node})" if node else f"rank {rank}"


def _named(record: Mapping[str, Any]) -> str:
    return _who(int(record["rank"]), str(record.get("node", "")))


def render_block(records: Sequence[Mapping[str, Any]], prog: str = "unirank run") -> str:
    """The block printed at the end of a run: each rank's time in collectives (grouped as
    min / median / max above :data:`PER_RANK_LINES` ranks) and the stragglers; ``""`` when
    the run was too short (:func:`long_enough`)."""
    ranks = measured(records)
    if not long_enough(ranks):
        return ""
    wall = statistics.median(float(r["collectives"]["wall_s"]) for r in ranks)
    lines = [f"{prog}: time in collectives (sampled every {SAMPLE_PERIOD * 1000:.0f} ms), "
             f"of each rank's time from its first collective to its last:"]
    if len(ranks) <= PER_RANK_LINES:
        width = max(len(_named(r)) for r in ranks)
        for r in ranks:
            waits = r["collectives"]
            lines.append(f"  {_named(r):<{width}}  "
                         f"{float(waits['in_s']):7.1f} s of {float(waits['wall_s']):.1f} s "
                         f"({_percent(_fraction(r))})")
    else:
        by = sorted(ranks, key=_fraction)
        low, high = by[0], by[-1]
        lines.append(f"  {len(ranks)} ranks, {wall:.1f} s (median): "
                     f"min {_percent(_fraction(low))} {_named(low)}, "
                     f"median {_percent(statistics.median(_fraction(r) for r in ranks))}, "
                     f"max {_percent(_fraction(high))} {_named(high)}")
    stragglers = stragglers_of(ranks)
    for straggler in stragglers[:PER_RANK_LINES]:
        lines.append(f"{prog}: {_who(straggler.rank, straggler.node)} kept the others waiting "
                     f"{_percent(straggler.margin)} of the time")
    if len(stragglers) > PER_RANK_LINES:
        lines.append(f"{prog}: and {len(stragglers) - PER_RANK_LINES} more rank(s) that kept "
                     f"the others waiting")
    return "\n".join(lines) + "\n"


def collective_rows(records: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[float],
                                                                          str]]:
    """The ``--timeline`` table's rows of the same numbers: (label, [min, median, max], the
    rank that spent the least time in collectives, named as the table names ranks)."""
    ranks = measured(records)
    if not ranks:
        return []
    least = min(ranks, key=lambda r: (_fraction(r), int(r["rank"])))
    who = f"rank {least['rank']} on {least.get('node', '')} (least)"
    rows = []
    for label, values in (
            ("in collectives (s)", [float(r["collectives"]["in_s"]) for r in ranks]),
            ("in collectives (%)", [100 * _fraction(r) for r in ranks])):
        rows.append((label, [min(values), statistics.median(values), max(values)], who))
    return rows
