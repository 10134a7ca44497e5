"""The start-up timeline (``unirank run --timeline``): when each rank reached each start-up phase.

Phases, in order: the node's fork server started and ended its imports (``preload``,
``preloaded``: the same for every rank of a node; absent when workers start as their own
interpreters), the supervisor started the worker process (``started``: asked the server to fork
it), the bootstrap ran its first line (``bootstrap``: the forked child began), torch was
imported (``torch``), every rank had joined (``joined``), the user's program started
(``script``), ``init_process_group`` returned (``pg_init``) and the first collective called
from Python returned (``first_collective``: ``barrier``, ``all_reduce``, ``broadcast`` or
``all_gather``; a collective made inside C++, as DDP's first broadcast, is not seen). The last
two are seen by wrapping those torch functions before the program starts.

Each rank keeps its own times (``time.time()``, a few calls) and, at the end of its program,
sets them in the rendezvous store under one key (O(1) per rank), in its end-of-run record
(:func:`publish`), which also carries the rank's time in collectives measured by its hang
watcher (:mod:`unirank.hang.waits`, without ``--timeline`` too). Rank 0, which hosts the store
and already waits for the others at its end, reads them all in one ``multi_get`` (:func:`gather`)
and writes them to the file its supervisor named; node 0's supervisor prints the table (with
the time in collectives as rows) and the stragglers' block
(:func:`unirank.hang.straggle.render_block`). With neither the timeline nor the hang watcher,
nothing of this runs. Pure except :class:`Recorder`'s hooks and the store calls.

The worker's bootstrap (:mod:`.info`) reads UNIRANK_TIMELINE (the launch time, set by the
supervisor when on) and UNIRANK_TIMELINE_FILE (rank 0 only: where to write the gathered
records), and passes the :class:`Recorder` it builds along.
"""

from __future__ import annotations

import contextlib
import functools
import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from unirank.contract import TIMELINE_FILE_VAR, TIMELINE_VAR
from unirank.hang.straggle import collective_rows
from unirank.storekeys.timeline import record_key
from unirank.words import counted

__all__ = ["PHASES", "TIMELINE_FILE_VAR", "TIMELINE_VAR", "Recorder", "format_table", "gather",
           "publish"]

PHASES: tuple[tuple[str, str], ...] = (
    ("preload", "fork server importing"),
    ("preloaded", "fork server imported"),
    ("started", "worker process started"),
    ("bootstrap", "bootstrap entered"),
    ("torch", "torch imported"),
    ("joined", "all ranks joined"),
    ("script", "user script started"),
    ("pg_init", "process group initialised"),
    ("first_collective", "first collective done"),
)
_SERVER_PHASES = ("preload", "preloaded")
_COLLECTIVES = ("barrier", "all_reduce", "broadcast", "all_gather")


class Recorder:
    """One rank's phase times."""

    def __init__(self, rank: int, node: str, started: float,
                 preloaded: tuple[float, float] | None = None) -> None:
        self.rank = rank
        self.node = node
        self.times: dict[str, float] = (
            {} if preloaded is None else {"preload": preloaded[0], "preloaded": preloaded[1]})
        self.times["started"] = started

    def mark(self, phase: str) -> None:
        """Note that this rank reached ``phase`` now (the first time only)."""
        self.times.setdefault(phase, time.time())

    def install_hooks(self) -> None:
        """Wrap ``init_process_group`` and the first collectives to see when they return."""
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        for name, phase in (("init_process_group", "pg_init"),
                            *((c, "first_collective") for c in _COLLECTIVES)):
            original = getattr(c10d, name, None)
            if original is None:
                continue
            wrapped = self._wrap(original, phase)
            for module in (dist, c10d):
                if getattr(module, name, None) is original:
                    setattr(module, name, wrapped)

    def _wrap(self, fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = fn(*args, **kwargs)
            self.mark(phase)
            return result

        return wrapper


def publish(store: Any, rank: int, node: str, parts: Mapping[str, Any]) -> None:
    """Set this rank's end-of-run record in the store (one key): ``parts`` are ``times`` (the
    :class:`Recorder`'s), ``collectives`` and ``watcher`` (the hang watcher's
    :meth:`~unirank.hang.watcher.Watcher.end_record`). Never raises."""
    with contextlib.suppress(Exception):  # a timeline must not fail a job
        store.set(record_key(rank), json.dumps({"rank": rank, "node": node, **parts}))


def gather(store: Any, world_size: int, path: str) -> None:
    """Rank 0: read every rank's record (those that published) and write them to ``path``."""
    try:
        keys = [record_key(r) for r in range(world_size)]
        if not store.check(keys):  # a rank ended without publishing: take the others'
            keys = [k for k in keys if store.check([k])]
        values = store.multi_get(keys) if keys else []
        records = [json.loads(bytes(v).decode()) for v in values]
    except Exception:
        records = []
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(records, fh)


def format_table(records: Sequence[Mapping[str, Any]]) -> str:
    """One row per phase: min / median / max over ranks, in seconds after the first worker
    started, and the slowest rank with its node; then each rank's time in collectives (seconds
    and percent of its collective activity), where measured, with the rank that spent the
    least (the one the others waited for)."""
    if not any(r.get("times") for r in records):
        return "unirank run: timeline: no rank reported its times\n"
    records = [r for r in records if r.get("times")]
    origin = min(min(r["times"].values()) for r in records)
    first = "fork server" if any("preload" in r["times"] for r in records) else "worker"
    lines = [f"unirank run: start-up timeline of {counted(len(records), 'rank')}, seconds after "
             f"the first {first} started",
             f"  {'phase':<27} {'min':>8} {'median':>8} {'max':>8}  slowest"]
    for key, label in PHASES:
        seen = [(r["times"][key] - origin, r) for r in records if key in r["times"]]
        if not seen and key in _SERVER_PHASES:
            continue  # workers started as their own interpreters
        if not seen:
            lines.append(f"  {label:<27} {'-':>8} {'-':>8} {'-':>8}  (not seen)")
            continue
        values = sorted(v for v, _ in seen)
        worst, who = max(seen, key=lambda item: (item[0], -item[1]["rank"]))
        missing = f" ({counted(len(records) - len(seen), 'rank')} never reached it)" \
            if len(seen) < len(records) else ""
        lines.append(f"  {label:<27} {values[0]:8.3f} {statistics.median(values):8.3f} "
                     f"{worst:8.3f}  rank {who['rank']} on {who['node']}{missing}")
    for label, (low, median, high), least in collective_rows(records):
        lines.append(f"  {label:<27} {low:8.3f} {median:8.3f} {high:8.3f}  {least}")
    return "\n".join(lines) + "\n"
