"""How long this rank spent inside collectives: sampled from torch's flight recorder status.

Torch 2.13 under gloo fills no completion time in the flight recorder's entries
(``time_discovered_completed_ns`` is 0, ``duration_ms`` is absent), and completion hooks are
NCCL's only; what every backend keeps is each group's status: its last entered and last
completed collective. So the hang watcher's thread (:mod:`.watcher`) looks at that status every
:data:`SAMPLE_PERIOD` seconds between its records (a C call of a few microseconds and a small
JSON document; no Python code runs per collective): a rank with a collective entered and not
completed in any group is *in collectives* at that moment, and the time since the previous look
is counted as such. :class:`WaitMeter` adds these up (pure: it takes the looks as data).

The window is the rank's collective activity: from the first look that shows a collective
entered to the last look that shows one in flight, or one entered or completed since the look
before (what the program does before its first collective and after its last one is not
counted). Nothing is missed for good
(no entry falls out of a ring); a collective shorter than the period is counted in proportion
to how often it is seen, so the fraction is an estimate with a standard error of about
``sqrt(f (1 - f) / n)`` over ``n`` looks (a 10 s run, 200 looks: at most 3.5 percentage points;
a 10-minute run: under half a point). The period trades that against the thread's cost: in a
training process a look takes 100-150 us of the thread's CPU (measured with
``time.thread_time``: the status call, its JSON and the wake-up, slower there than in a quiet
process), 20 a second are about 0.3 % of one core.

Reads no environment variable.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MARK_AFTER", "SAMPLE_PERIOD", "CollectiveMark", "WaitMeter", "completed",
           "in_flight", "recorder_dump", "recorder_status", "recorder_trace", "retired_through",
           "settle"]

#: seconds between two looks at the flight recorder's status (20 per second)
SAMPLE_PERIOD = 0.05
#: seconds a rank waits in one collective before it keeps its :class:`CollectiveMark` (a
#: training loop's collectives come and go faster: the mark changes seldom)
MARK_AFTER = 1.0


def recorder_dump() -> Callable[..., bytes] | None:
    """Torch's flight recorder dump function (``_dump_fr_trace_json``); None before the
    program imported ``torch.distributed``, or where torch has none. Imports nothing."""
    if "torch.distributed" not in sys.modules:
        return None
    dump = getattr(sys.modules.get("torch._C._distributed_c10d"), "_dump_fr_trace_json", None)
    return dump if callable(dump) else None


#: each group's highest collective that the recorder's entries show completed with every one
#: before it (:func:`retired_through`), as of the last :func:`recorder_trace`
_RETIRED: dict[str, int] = {}


def retired_through(entries: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Each group's highest collective number up to which every kept entry of the group is
    ``retired`` (completed): the number just before its first one not retired, else its
    last. Point-to-point entries have their own numbering and are left out."""
    found: dict[str, int] = {}
    open_at: dict[str, int] = {}
    for entry in entries:
        if not isinstance(entry, Mapping) or entry.get("is_p2p"):
            continue
        try:
            pg, seq = str(entry.get("pg_id")), int(entry.get("collective_seq_id", -1))
        except (TypeError, ValueError):
            continue
        if seq < 0:
            continue
        if entry.get("retired"):
            found[pg] = max(found.get(pg, -1), seq)
        else:
            open_at[pg] = min(open_at.get(pg, seq), seq)
    for pg, seq in open_at.items():
        found[pg] = seq - 1
    return found


def completed(entered: int, done: int, retired: int | None) -> int:
    """A group's last completed collective: the recorder's status says ``done``, the number of
    the collective completed *last in time*; where two of gloo's work threads complete theirs
    out of order it stays behind (a rank whose collectives #3 and #4 both completed shows
    ``done`` 2 for good when #2's thread was last to retire it: 1 run in 12 pinned to one
    core), and the rank would seem to wait in a collective it has left. ``retired``: the
    entries' number (:func:`retired_through`; None: unknown), taken where larger and not past
    ``entered`` (a group made again numbers from 1)."""
    if retired is None or retired > entered:
        return done
    return max(done, retired)


def settle(status: Mapping[str, Any]) -> dict[str, Any]:
    """The recorder's ``status`` with each group's ``last_completed_collective`` per
    :func:`completed` and the entries of the last :func:`recorder_trace`."""
    settled: dict[str, Any] = {}
    for pg, group in status.items():
        settled[pg] = group
        if not isinstance(group, Mapping) or str(pg) not in _RETIRED:
            continue
        with contextlib.suppress(TypeError, ValueError):
            entered = int(group.get("last_enqueued_collective", -1))
            done = int(group.get("last_completed_collective", -1))
            now = completed(entered, done, _RETIRED[str(pg)])
            if now != done:
                settled[pg] = {**group, "last_completed_collective": str(now)}
    return settled


def recorder_trace() -> Mapping[str, Any] | None:
    """The recorder's whole dump with its entries (every kept collective, finished or not;
    64 entries: about 2 ms), its ``pg_status`` settled (:func:`settle`); None where it cannot
    be read. Not ``_dump_fr_trace`` with its stacks: that imports ``torch._inductor``
    (seconds, and an import in the watcher's thread). Imports nothing."""
    dump = recorder_dump()
    if dump is None:
        return None
    try:
        data: Any = json.loads(dump(True, False))
    except Exception:  # private API: any failure is "no information"
        return None
    if not isinstance(data, Mapping):
        return None
    _RETIRED.clear()
    _RETIRED.update(retired_through(data.get("entries", ()) or ()))
    if isinstance(data.get("pg_status"), Mapping):
        data = {**data, "pg_status": settle(data["pg_status"])}
    return dict(data)


def recorder_status(*, exact: bool = False) -> Mapping[str, Any] | None:
    """Every group's status now (``pg_status``: group id -> last entered / completed
    collective), settled (:func:`settle`) by the entries of the last :func:`recorder_trace`;
    where ``exact``, the status of a trace read now (about 2 ms, not microseconds); None where
    it cannot be read."""
    dump = recorder_dump()
    if dump is None:
        return None
    if exact:
        trace = recorder_trace()
        status = None if trace is None else trace.get("pg_status")
        if isinstance(status, Mapping):
            return status
    try:
        status = json.loads(dump(False, True)).get("pg_status")
    except Exception:  # private API: any failure is "no information"
        return None
    return settle(status) if isinstance(status, Mapping) else None


def in_flight(status: Mapping[str, Any]) -> tuple[bool, int]:
    """Whether some group has a collective entered and not completed, and the sum of the
    groups' last entered and last completed numbers (it moves whenever the rank enters or
    completes a collective)."""
    waiting, moves = False, 0
    for group in status.values():
        entered = int(group.get("last_enqueued_collective", -1))
        done = int(group.get("last_completed_collective", -1))
        waiting = waiting or entered > done
        moves += max(entered, 0) + max(done, 0)
    return waiting, moves


@dataclass
class WaitMeter:
    """The time in collectives over the rank's collective activity (see the module docstring).
    Feed it :meth:`look` with a monotonic clock's time and :func:`recorder_status`."""

    #: seconds counted inside collectives
    in_s: float = 0.0
    #: looks taken inside the window
    samples: int = 0
    _first: float | None = None
    _last_active: float = 0.0
    _previous: float = 0.0
    _moves: int = 0
    #: since when (the look's ``now``) the rank waits in the same collectives (None: not)
    _waiting_since: float | None = None
    #: the wait whose collectives were confirmed in flight (:meth:`to_confirm`)
    _confirmed: float | None = None

    def look(self, now: float, status: Mapping[str, Any] | None) -> None:
        """Count one look at ``now`` (seconds, monotonic)."""
        if not status:
            return
        waiting, moves = in_flight(status)
        if self._first is None:
            if moves <= 0:
                return
            self._first = self._previous = self._last_active = now
            self._moves = moves
        if waiting:
            self.in_s += now - self._previous
        if not waiting:
            self._waiting_since = None
        elif self._waiting_since is None or moves != self._moves:
            self._waiting_since = now
        if waiting or moves != self._moves:
            self._last_active = now
            self._moves = moves
        self._previous = now
        self.samples += 1

    def to_confirm(self, now: float) -> bool:
        """Whether the look at ``now`` reads the recorder's entries as well
        (:func:`recorder_status` ``exact``): once per wait that has lasted :data:`MARK_AFTER`,
        before its :class:`CollectiveMark` is kept, so that collectives the status shows in
        flight while they completed (:func:`completed`) are never marked."""
        since = self._waiting_since
        if since is None or now - since < MARK_AFTER or since == self._confirmed:
            return False
        self._confirmed = since
        return True

    def waiting_for(self, now: float) -> float:
        """Seconds the rank has waited in the collectives in flight at the last look, none
        entered or completed meanwhile (0: none in flight)."""
        return 0.0 if self._waiting_since is None else now - self._waiting_since

    @property
    def wall_s(self) -> float:
        """Seconds from the first to the last look that saw a collective."""
        return 0.0 if self._first is None else self._last_active - self._first

    def summary(self) -> dict[str, Any]:
        """What the end-of-run record carries: ``in_s``, ``wall_s``, ``samples``."""
        return {"in_s": round(min(self.in_s, self.wall_s), 4), "wall_s": round(self.wall_s, 4),
                "samples": self.samples}


class CollectiveMark:
    """A file kept while the rank waits in one collective for :data:`MARK_AFTER` seconds or
    more (:meth:`unirank.runfolder.AttemptFolder.collective_mark`): when a node is gone, its
    supervisor ends at once the workers that wait so (:mod:`unirank.supervisor.stoppolicy`;
    their stop handler cannot run while the collective holds the main thread). Made and
    removed only when that changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.kept = False

    def update(self, waiting_s: float) -> None:
        """The rank has waited ``waiting_s`` seconds in its collective (0: in none)."""
        keep = waiting_s >= MARK_AFTER
        if keep == self.kept or not self.path:
            return
        self.kept = keep
        with contextlib.suppress(OSError):
            if keep:
                with open(self.path, "w", encoding="utf-8"):
                    pass
            else:
                os.unlink(self.path)
