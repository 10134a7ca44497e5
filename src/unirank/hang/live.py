"""A rank's live record for ``unirank top``: published by its hang watcher only while a view
watches, so that a job nobody watches pays one store read per watcher interval for it.

A view adds 1 to :data:`~unirank.storekeys.hang.WATCH_KEY` at every refresh (its beat; no
clocks are compared across machines). At each of its ticks (every interval) the watcher reads
the beat (one ``add(key, 0)``): when it moved since the tick before, someone watches, and until
a tick finds it still, the watcher sets this rank's live record (:func:`live_record`, one
``set`` of a few hundred bytes under :func:`~unirank.storekeys.hang.live_key`) every
:data:`LIVE_PERIOD` seconds. A view opened now sees live records after the watchers' next tick
(up to one interval: 5 s by default); until then it reads their progress records.

The record is the progress record's summary (:mod:`.progress`: ``rank``, ``node``,
``time``, ``where``, ``finished``, each group's ``pg``, ``ranks``, ``entered``, ``done``,
``op``, ``since``: what :func:`unirank.hang.detect.find_hangs` reads) with the groups'
numbers read now from the flight recorder's status (:func:`~unirank.hang.waits.
recorder_status`: microseconds, no entries), and ``in_s`` (the rank's seconds in
collectives so far, :class:`~unirank.hang.waits.WaitMeter`; None where not measured) and
``restart`` (the attempt's number, TORCHELASTIC_RESTART_COUNT); the watcher adds the last two
to its progress records too (:meth:`Live.stamp`). A group's ``op`` and ``since`` come from
the last progress record where it was still at the same collective; past it, ``since`` is
when this module first saw the new number (at most :data:`LIVE_PERIOD` late) and ``op`` is
unknown.

Reads TORCHELASTIC_RESTART_COUNT, from the mapping the watcher passes (:func:`restart_of`).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping
from typing import Any

from unirank.contract import RESTART_COUNT_VAR
from unirank.envvars import read_int
from unirank.errors import ConfigError
from unirank.hang.waits import WaitMeter, recorder_status
from unirank.storekeys.hang import WATCH_KEY, live_key

__all__ = ["LIVE_PERIOD", "Live", "live_record", "restart_of"]

#: seconds between two live records of a rank while a view watches
LIVE_PERIOD = 1.0


def restart_of(environ: Mapping[str, str]) -> int:
    """The attempt's restart count (TORCHELASTIC_RESTART_COUNT; 0 where unset or bad)."""
    try:
        return read_int(environ, RESTART_COUNT_VAR) if RESTART_COUNT_VAR in environ else 0
    except ConfigError:
        return 0


def live_record(base: Mapping[str, Any], status: Mapping[str, Any] | None, now: float,
                seen: dict[str, tuple[int, float]], *, in_s: float | None, restart: int,
                finished: bool = False) -> dict[str, Any]:
    """The live record (module docstring) from the last progress record ``base``, the
    recorder's ``status`` now (None: unknown, ``base``'s numbers stay) at wall clock ``now``;
    ``seen``: group -> (entered number, when first seen), kept by the caller across calls."""
    groups = []
    for group in base.get("groups", ()):
        pg = str(group["pg"])
        now_status = (status or {}).get(pg) or {}
        entered = int(now_status.get("last_enqueued_collective", group["entered"]))
        done = int(now_status.get("last_completed_collective", group["done"]))
        same = entered == group["entered"]
        if seen.get(pg, (None, 0.0))[0] != entered:
            seen[pg] = (entered, now)
        groups.append({"pg": pg, "ranks": group.get("ranks"), "entered": entered, "done": done,
                       "op": group.get("op", "") if same else "",
                       "since": group.get("since") if same and group.get("since")
                       else seen[pg][1]})
    return {"rank": base["rank"], "node": base.get("node", ""), "time": now,
            "where": base.get("where", ""), "finished": finished or bool(base.get("finished")),
            "groups": groups, "in_s": None if in_s is None else round(in_s, 4),
            "restart": restart}


class Live:
    """The watcher's side (module docstring): :meth:`tick` at every tick, :meth:`look`
    between ticks, :meth:`publish` with every progress record."""

    def __init__(self, rank: int, restart: int) -> None:
        self.rank, self.restart = rank, restart
        #: someone watches: publish every :data:`LIVE_PERIOD`
        self.watched = False
        self._beat: int | None = None
        self._base: Mapping[str, Any] | None = None
        self._next = 0.0
        self._seen: dict[str, tuple[int, float]] = {}

    def tick(self, store: Any) -> None:
        """Read the views' beat: someone watches while it moves from one tick to the next."""
        beat = int(store.add(WATCH_KEY, 0))
        self.watched = self._beat is not None and beat != self._beat
        self._beat = beat

    def stamp(self, record: dict[str, Any], waits: WaitMeter | None) -> None:
        """Add ``in_s`` and ``restart`` to a progress record (a view reads them there until
        the live records come)."""
        record.update(in_s=None if waits is None else round(waits.in_s, 4),
                      restart=self.restart)

    def publish(self, store: Any, base: Mapping[str, Any], waits: WaitMeter | None,
                status: Mapping[str, Any] | None = None) -> None:
        """Set the live record made from progress record ``base`` (kept for :meth:`look`),
        where someone watches."""
        self._base = base
        if not self.watched:
            return
        record = live_record(base, status, time.time(), self._seen,
                             in_s=None if waits is None else waits.in_s, restart=self.restart,
                             finished=bool(base.get("finished")))
        store.set(live_key(self.rank), json.dumps(record))
        self._next = time.monotonic() + LIVE_PERIOD

    def look(self, store: Any, now: float, waits: WaitMeter | None,
             status: Mapping[str, Any] | None = None) -> None:
        """Between two ticks (``now``: monotonic): the live record, when one is due, with the
        recorder's ``status`` just read (None: read here); a store that fails here is the
        next tick's to find."""
        if not self.watched or self._base is None or now < self._next:
            return
        with contextlib.suppress(Exception):
            self.publish(store, self._base, waits,
                         recorder_status() if status is None else status)

    def period(self, sampling: float | None) -> float | None:
        """Seconds between two looks between ticks: ``sampling`` (the wait meter's), else
        :data:`LIVE_PERIOD` while watched; None: no look is needed."""
        if sampling is not None:
            return sampling
        return LIVE_PERIOD if self.watched else None
