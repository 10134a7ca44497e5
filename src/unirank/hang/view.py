"""``unirank top``'s rows (pure): each rank's records at two moments in, one row per rank out
(its rates, its state, the marks), with the lines that say why a rank is marked.

The records are the hang watcher's (:mod:`.live`'s live records, else :mod:`.progress`'s
progress records: the same fields). Rates are taken between a rank's record now and its oldest
one within :data:`WINDOW` seconds, each on that rank's own clock (no two machines' clocks are
compared): *collectives per second* (its groups' finished collectives) and *share waiting*
(its seconds in collectives, ``in_s``, over the seconds between the records; where the waits
are measured: ``unirank run``'s workers).

A rank's state, the first that applies:

* ``stuck``: the hang detector's rule (:func:`unirank.hang.detect.find_hangs`) finds a hang
  whose blame (:func:`~unirank.hang.detect.blame`) leaves this rank out as stuck: it has not
  entered the collective the others have waited in for :func:`stuck_after` seconds, and its
  program runs (:attr:`~unirank.hang.detect.Blame.stuck`, as ``--on-hang evict`` decides);
* ``ended``: its program ended;
* ``slow``: the straggler rule (:func:`unirank.hang.straggle.find_stragglers`) over the
  window's shares (:func:`share_of`): the median of the other ranks' share waiting exceeds
  its own by more than :data:`~unirank.hang.straggle.STRAGGLER_MARGIN` (it keeps them
  waiting), the window spanning :data:`MIN_SPAN` seconds at least; or the hang detector
  names it a straggler now (:mod:`unirank.hang.slowrank`: the same rule over its windows);
* ``waiting``: it has waited in one collective for :data:`~unirank.hang.waits.MARK_AFTER`
  seconds or more (the rule of the collective mark);
* ``running``; ``-`` where the rank set no record yet.

Between two attempts (the job's store stopped answering while the process that runs its
attempts runs on: a restart, a node lost or joining) every rank is ``restarting``
(:func:`restarting`), its rates unknown, until the next attempt's records come; but the ranks
of a node the supervisors evicted (``--on-hang evict``, ``--on-slow evict``: each rank of
that node, as the node's ``unirank run`` recorded them, :func:`unirank.runfolder.
write_evicted`) are ``evicted``, and the note says why.

Waits are judged at the oldest record's time (:func:`judged_at`): a record a few seconds old
(the progress records come every interval until the live ones do) never makes a wait look
longer than its rank has said. Evicted nodes and spares are the supervisors' to know, not
the store's: the header counts the spares, and ``unirank top`` passes the eviction its node's
``unirank run`` recorded to :func:`restarting`.

Reads no environment variable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from unirank.hang.detect import blame, find_hangs, waited_in
from unirank.hang.render import wavefront_line
from unirank.hang.straggle import Straggler, find_stragglers
from unirank.hang.waits import MARK_AFTER

__all__ = ["ENDED", "EVICTED", "MIN_SPAN", "NONE", "RESTARTING", "RUNNING", "SLOW", "SPARE",
           "STUCK", "STUCK_AFTER", "WAITING", "WINDOW", "History", "Row", "View", "judged_at",
           "make_view", "newest_records", "restarting", "share_of", "stuck_after"]

STUCK, ENDED, SLOW, WAITING, RUNNING, NONE = "stuck", "ended", "slow", "waiting", "running", "-"
RESTARTING, EVICTED = "restarting", "evicted"
#: a spare node's line (no rank: it waits to join; the table's, from the header)
SPARE = "spare"
#: seconds of a rank's records its rates span (at most)
WINDOW = 5.0
#: the shortest window (seconds) whose shares may name a slow rank
MIN_SPAN = 2.0
#: seconds the others wait for a rank that has not entered their collective before the view
#: marks it stuck (the detector's ``--hang-report-after``, where that is shorter)
STUCK_AFTER = 5.0


def stuck_after(report_after: float | None) -> float:
    """The view's stuck threshold for a job whose detector reports after ``report_after``."""
    return STUCK_AFTER if report_after is None else min(STUCK_AFTER, report_after)


@dataclass(frozen=True)
class Row:
    """One rank's line of the view."""

    rank: int
    node: str = ""
    state: str = NONE
    #: finished collectives per second over the window (None: not known yet)
    per_s: float | None = None
    #: share of the window's time in collectives, 0-1 (None: not measured)
    waiting: float | None = None
    #: its main group's last entered collective: op ("" unknown) and number (None: none)
    op: str = ""
    number: int | None = None
    restarts: int | None = None


@dataclass(frozen=True)
class View:
    """Every rank's row, and the lines that say why ranks are marked."""

    rows: tuple[Row, ...]
    notes: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()

    @property
    def marked(self) -> dict[str, list[int]]:
        """The stuck and the slow ranks."""
        return {s: [r.rank for r in self.rows if r.state == s] for s in (STUCK, SLOW)}


@dataclass
class History:
    """Each rank's records of the last :data:`WINDOW` seconds (its own clock), newest last."""

    kept: dict[int, list[Mapping[str, Any]]] = field(default_factory=dict)

    def add(self, rank: int, record: Mapping[str, Any] | None) -> None:
        """Keep ``record`` where it is newer than the rank's newest; drop what left the window."""
        if record is None:
            return
        mine = self.kept.setdefault(rank, [])
        if mine and float(record["time"]) <= float(mine[-1]["time"]):
            return
        mine.append(record)
        newest = float(record["time"])
        while len(mine) > 1 and (newest - float(mine[0]["time"]) > 2 * WINDOW or (
                len(mine) > 2 and newest - float(mine[1]["time"]) >= WINDOW)):
            mine.pop(0)

    def newest(self) -> dict[int, Mapping[str, Any]]:
        """Each rank's newest record."""
        return {r: kept[-1] for r, kept in self.kept.items() if kept}

    def oldest(self) -> dict[int, Mapping[str, Any]]:
        """Each rank's oldest record of the window (where it has two)."""
        return {r: kept[0] for r, kept in self.kept.items() if len(kept) > 1}


def _main_group(record: Mapping[str, Any]) -> Mapping[str, Any] | None:
    groups = list(record.get("groups", ()))
    return next((g for g in groups if g.get("ranks") is None), groups[0] if groups else None)


def _rates(old: Mapping[str, Any] | None, new: Mapping[str, Any]
           ) -> tuple[float | None, float | None, float]:
    """Collectives per second (None: no group in both records: the old one was made before
    the first collective), share waiting, and the seconds between the two records."""
    if old is None:
        return None, None, 0.0
    span = float(new["time"]) - float(old["time"])
    if span <= 0:
        return None, None, 0.0
    done = {str(g["pg"]): int(g["done"]) for g in old.get("groups", ())}
    both = [g for g in new.get("groups", ()) if str(g["pg"]) in done]
    moved = sum(max(0, int(g["done"]) - done[str(g["pg"])]) for g in both)
    share = None
    if new.get("in_s") is not None and old.get("in_s") is not None:
        share = min(1.0, max(0.0, (float(new["in_s"]) - float(old["in_s"])) / span))
    return (moved / span if both else None), share, span


def share_of(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> float | None:
    """A rank's share waiting between its records ``old`` and ``new`` where the straggler
    rule may judge it (the window spans :data:`MIN_SPAN` seconds, the rank has not ended),
    else None: the one window rule of the view and of the detector's stragglers
    (:mod:`unirank.hang.slowrank`)."""
    _, share, span = _rates(old, new)
    if share is None or span < MIN_SPAN or new.get("finished"):
        return None
    return share


def _state(record: Mapping[str, Any], now: float) -> str:
    if record.get("finished"):
        return ENDED
    for group in record.get("groups", ()):
        waited = waited_in(record, group, now)
        if waited is not None and waited >= MARK_AFTER:
            return WAITING
    return RUNNING


def judged_at(new: Mapping[int, Mapping[str, Any] | None], now: float, silent: float) -> float:
    """The moment the view judges waits at: the oldest record's time (no wait is stretched
    past what every rank has said), but of a rank silent for ``silent`` seconds or more
    (frozen: it would hold the view's clock back), and never after ``now``."""
    times = [float(r["time"]) for r in new.values() if r is not None]
    return min([t for t in times if now - t < silent] + [now])


def make_view(old: Mapping[int, Mapping[str, Any]], new: Mapping[int, Mapping[str, Any] | None],
              world_size: int, now: float, report_after: float | None = None,
              silent: float = float("inf"), named: Sequence[Straggler] = ()) -> View:
    """The view (module docstring) of ``world_size`` ranks from each rank's ``new`` record and
    its ``old`` one (the window's start), at wall clock ``now`` (the waits judged at
    :func:`judged_at` with ``silent``); ``named``: the stragglers the detector names now
    (:mod:`unirank.hang.slowrank`), slow too where the window alone does not say so."""
    now = judged_at(new, now, silent)
    hangs = find_hangs(new, world_size, stuck_after(report_after), now)
    stuck = {r for h in hangs for r in blame(h).stuck}
    notes = [wavefront_line(h) for h in hangs]
    rows, shares, nodes = {}, {}, {}
    for rank in range(world_size):
        record = new.get(rank)
        if record is None:
            rows[rank] = Row(rank)
            continue
        nodes[rank] = str(record.get("node", ""))
        per_s, share, _ = _rates(old.get(rank), record)
        judged = share_of(old.get(rank), record)
        if judged is not None:
            shares[rank] = judged
        group = _main_group(record)
        rows[rank] = Row(rank, nodes[rank], STUCK if rank in stuck else _state(record, now),
                         per_s, share, str((group or {}).get("op", "")),
                         None if group is None else int(group["entered"]),
                         record.get("restart"))
    window = find_stragglers(shares, nodes) if not hangs else []
    seen = {s.rank for s in window}
    for straggler in [*window, *(s for s in named if s.rank not in seen and not hangs
                                 and s.rank in rows)]:
        row = rows[straggler.rank]
        if row.state in (RUNNING, WAITING):
            rows[straggler.rank] = Row(**{**row.__dict__, "state": SLOW})
            notes.append(f"{_who(straggler.rank, straggler.node)} keeps the others waiting: "
                         f"{100 * straggler.margin:.0f} % of the time")
    return View(tuple(rows[r] for r in range(world_size)), tuple(notes),
                tuple(sorted(set(nodes.values()) - {""})))


def restarting(view: View, evicted: tuple[Sequence[int], str] | None = None) -> View:
    """``view`` between two attempts: every rank restarting, its rates and marks dropped (its
    node, last collective and restart count kept until the next attempt's records come); but
    ``evicted``'s ranks (every rank of the nodes left out, and why) evicted."""
    gone, why = evicted or ((), "")
    rows = tuple(Row(r.rank, r.node, EVICTED if r.rank in gone else RESTARTING, op=r.op,
                     number=r.number, restarts=r.restarts) for r in view.rows)
    notes = ((why,) if why and gone else ()) + (
        "the job's store stopped answering: waiting for its next attempt",)
    return View(rows, notes, view.nodes)


def _who(rank: int, node: str) -> str:
    return f"rank {rank} ({node})" if node else f"rank {rank}"


def newest_records(live: Mapping[int, Mapping[str, Any] | None],
                   progress: Mapping[int, Mapping[str, Any] | None]
                   ) -> dict[int, Mapping[str, Any] | None]:
    """Each rank's newer record of the two kinds (its own clock): a live record left by an
    earlier view is older than the progress records since."""
    ranks: Sequence[int] = sorted(set(live) | set(progress))
    found: dict[int, Mapping[str, Any] | None] = {}
    for rank in ranks:
        a, b = live.get(rank), progress.get(rank)
        found[rank] = a if b is None or (a is not None and float(a["time"]) >= float(b["time"])
                                         ) else b
    return found
