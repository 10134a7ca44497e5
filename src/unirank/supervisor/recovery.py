"""A restart's own story, pure: when its line is said, and its phases for ``--timeline``.

* :func:`restart_line_waits`: the line ``attempt N failed (...); restarting the workers`` is
  said at once, except where this node may be the one ``--on-hang evict`` stops (the attempt
  ended at the hang timeout, or the world changed): it is then said once the next round has
  taken this node, so that an evicted node says only the one line of its eviction.
* :class:`NextRound`: what a restart's re-plan gives the engine (:mod:`.attempts`): the plan,
  the round line (``rendezvous round 1: ...``, said after the restart's line) and how long
  before the rendezvous the news came.
* :class:`Recovery` and :func:`format_recovery`: the phases of the last recovery (the news
  noticed, the workers stopped, the rendezvous closed, the workers started, the first
  collective), in seconds after the news, as the round line gives the first three; printed
  under the start-up timeline (:func:`unirank.supervisor.worker.timeline.format_table`), whose
  records, those of the attempt after the recovery, give the last two.

Reads no environment variable; no torch.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from unirank.supervisor.plan import Plan

__all__ = ["NextRound", "Recovery", "format_recovery", "restart_line_waits"]


def restart_line_waits(on_hang: str, hang_ended: bool, world_changed: str | None) -> bool:
    """Whether the restart's line waits for the next round: where ``--on-hang evict`` may stop
    this node, after an attempt that the hang timeout ended (``hang_ended``) or that a change
    of the world stopped (``world_changed``: this node's eviction may be what came)."""
    return on_hang == "evict" and (hang_ended or bool(world_changed))


@dataclass(frozen=True)
class NextRound:
    """A restart's plan, from the dynamic rendezvous's next round."""

    plan: Plan
    #: the round's line (said after the restart's line); "" for none
    line: str = ""
    #: seconds from the news of a change (a node lost, one waiting...) to the rendezvous's
    #: start; None where no news came (a worker failed)
    noticed: float | None = None
    #: the news that the rendezvous moved meanwhile (``store moved to node ...``), else None
    moved: str | None = None


@dataclass(frozen=True)
class Recovery:
    """One recovery's times on this node (``time.time()``, as the workers' timeline records)."""

    #: why the attempt before ended, in a few words (``node lost: node2``)
    why: str
    #: the attempt that this recovery started
    attempt: int
    #: the news came (a node lost...), or the attempt ended where no news came
    noticed: float
    #: every worker of the attempt before had ended
    stopped: float
    #: the next round closed (None: no rendezvous, the same plan again)
    rendezvous: float | None = None


_RANK_PHASES = (("started", "workers started"), ("first_collective", "first collective done"))


def format_recovery(recovery: Recovery, records: Sequence[Mapping[str, Any]]) -> str:
    """The recovery's rows, in seconds after the news: this node's phases (one value each),
    then the ranks' (min / median / max over the attempt's ``records``, the slowest rank)."""
    origin = recovery.noticed
    lines = [f"unirank run: recovery before attempt {recovery.attempt} ({recovery.why}), "
             "seconds after the news",
             f"  {'phase':<27} {'min':>8} {'median':>8} {'max':>8}  slowest"]
    for label, at in (("news noticed", recovery.noticed), ("workers stopped", recovery.stopped),
                      ("rendezvous closed", recovery.rendezvous)):
        if at is not None:
            lines.append(f"  {label:<27} {at - origin:8.3f}")
    timed = [r for r in records if isinstance(r.get("times"), Mapping)]
    for key, label in _RANK_PHASES:
        seen = [(r["times"][key] - origin, r) for r in timed if key in r["times"]]
        if not seen:
            lines.append(f"  {label:<27} {'-':>8} {'-':>8} {'-':>8}  (not seen)")
            continue
        values = sorted(v for v, _ in seen)
        worst, who = max(seen, key=lambda item: (item[0], -item[1]["rank"]))
        lines.append(f"  {label:<27} {values[0]:8.3f} {statistics.median(values):8.3f} "
                     f"{worst:8.3f}  rank {who['rank']} on {who['node']}")
    return "\n".join(lines) + "\n"
