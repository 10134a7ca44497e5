"""When the detector reports (pure): the first report of a hang after ``--hang-report-after``
seconds, then again at each doubling of the wait while the same hang lasts, and the last one
when the wait reaches ``--hang-timeout`` (which ends the job).

Only a hang's first report is full (every rank's stacks); the later ones are short (what
changed since, the wavefront, where the full dumps are), so that a long hang does not bury
the wavefront under stack dumps (the failure summary quotes the last lines of stderr). A
different hang (another group or collective number) starts over with a full report.

Reads no environment variable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from unirank.hang.detect import Hang

__all__ = ["Decision", "Schedule", "decide"]


@dataclass(frozen=True)
class Schedule:
    """The detector's state between two looks: which hang it reported, how many times, and
    at which wait (seconds) the next report is due."""

    key: tuple[tuple[str, int], ...] = ()
    number: int = 0
    next_at: float = 0.0


@dataclass(frozen=True)
class Decision:
    """What to do now: report (its number, full or short), and whether the job ends."""

    report: bool = False
    number: int = 0
    full: bool = False
    ending: bool = False


def decide(schedule: Schedule, hangs: Sequence[Hang], report_after: float,
           limit: float | None) -> tuple[Schedule, Decision]:
    """The next state and what to do, for the hangs seen now (``limit``: ``--hang-timeout``,
    None: never ends the job)."""
    key = tuple((h.pg, h.seq) for h in hangs)
    if key != schedule.key:
        schedule = Schedule(key, 0, report_after)
    if not hangs:
        return schedule, Decision()
    waited = max(h.waited for h in hangs)
    ending = limit is not None and waited >= limit
    if waited < schedule.next_at and not ending:
        return schedule, Decision()
    number = schedule.number + 1
    schedule = Schedule(key, number, max(schedule.next_at, waited) * 2)
    return schedule, Decision(True, number, number == 1, ending)
