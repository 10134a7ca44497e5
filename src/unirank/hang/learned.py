"""The learned hang timeout, and a stuck rank told from a slow one (pure).

Where the hang timeout is learned (``--hang-timeout auto``, the default of an elastic job:
:func:`unirank.contract.resolve_hang`), the detector (:mod:`unirank.hang.detector`) feeds
every look's records to :func:`observe` and asks :func:`timeout_now` and :func:`verdict_now`.
The rule, as docs/run.md states it:

* the timeout now is the larger of :data:`FLOOR` seconds and :data:`FACTOR` times the
  slowest wait seen so far in a collective that completed (a wait is seen at the watchers'
  looks, so it may count up to one interval short), leaving out the job's first
  collectives (numbered up to :data:`WARMUP`: the first step, its compilation) and any wait
  during which some rank was in a phase (:func:`unirank.phase`, ``ur.save_state``);
* a hang past it ends the job only when every rank that never entered the collective is
  stuck, not slow: it is in no phase, the collective is past :data:`WARMUP`, its main
  thread does not wait for its DataLoader workers, and either its watcher has published
  nothing for a late look (:data:`unirank.hang.timings.LATE_LOOK`: the process is stopped,
  SIGSTOP or a debugger, or its interpreter held) or its CPU time (the process's, but the
  watcher's own) moved less than :data:`BUSY_SHARE` of one core over the last
  :data:`QUIET` seconds (asleep in the user's code, or in uninterruptible sleep). A rank
  computing (its CPU time moving) is slow: the detector waits on, and reports as usual.

A record's ``cpu`` (seconds) and ``phase`` (the phase's name, ``""`` outside one) are set by
its watcher (:meth:`unirank.hang.watcher.Watcher.record`).

Reads no environment variable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from unirank.hang.detect import NOT_ENTERED, Hang, blame
from unirank.hang.timings import LATE_LOOK

__all__ = ["BUSY_SHARE", "FACTOR", "FLOOR", "QUIET", "WARMUP", "Learned", "Stuck",
           "observe", "stuck_reason", "timeout_now", "verdict_now"]

#: seconds: the learned timeout is never shorter
FLOOR = 3.0
#: the learned timeout is at least this many times the slowest wait seen
FACTOR = 4.0
#: collectives numbered up to this one (in each group) are the first step: they neither
#: teach the timeout nor end the job
WARMUP = 8
#: a rank whose CPU time moves at least this share of one core is busy (slow, not stuck)
BUSY_SHARE = 0.05
#: seconds over which a rank's CPU time must stay still for it to count as asleep
QUIET = 1.5
#: how many CPU samples are kept per rank (enough to span :data:`QUIET` at any interval)
_SAMPLES = 64

#: why a rank counts as stuck (:attr:`Stuck.why`)
SILENT = "silent"
ASLEEP = "asleep"


@dataclass(frozen=True)
class Learned:
    """What the detector learned so far: the slowest completed wait, the wait in flight of
    each rank and group ((rank, group) -> collective number, the longest wait seen, whether
    a phase was seen meanwhile), and each rank's last (time, CPU seconds) samples."""

    slowest: float = 0.0
    waits: Mapping[tuple[int, str], tuple[int, float, bool]] = field(default_factory=dict)
    cpu: Mapping[int, tuple[tuple[float, float], ...]] = field(default_factory=dict)


def _phase_seen(records: Mapping[int, Mapping[str, Any] | None]) -> bool:
    return any((record or {}).get("phase") for record in records.values())


def observe(learned: Learned, records: Mapping[int, Mapping[str, Any] | None]) -> Learned:
    """The state after one look at every rank's record."""
    phase = _phase_seen(records)
    slowest = learned.slowest
    waits = dict(learned.waits)
    cpu = dict(learned.cpu)
    for rank, record in records.items():
        if not record:
            continue
        for group in record.get("groups", ()):
            key = (rank, str(group["pg"]))
            seq, waited, phased = waits.get(key, (-1, 0.0, False))
            if 0 <= seq <= group["done"]:  # it completed: it teaches, past the first step
                if seq > WARMUP and not phased:
                    slowest = max(slowest, waited)
                waits.pop(key)
            if group["entered"] > group["done"] and group.get("since") is not None:
                seen = max(0.0, float(record["time"]) - float(group["since"]))
                if seq != group["entered"]:
                    waited, phased = 0.0, False
                waits[key] = (group["entered"], max(waited, seen), phased or phase)
        if "cpu" in record:
            sample = (float(record["time"]), float(record["cpu"]))
            kept = cpu.get(rank, ())
            if not kept or kept[-1][0] < sample[0]:
                cpu[rank] = (*kept, sample)[-_SAMPLES:]
    return replace(learned, slowest=slowest, waits=waits, cpu=cpu)


def timeout_now(learned: Learned) -> float:
    """The hang timeout now: :data:`FLOOR`, or :data:`FACTOR` times the slowest wait seen."""
    return max(FLOOR, FACTOR * learned.slowest)


@dataclass(frozen=True)
class Stuck:
    """A rank that is stuck, and why: :data:`SILENT` (no record for ``seconds``) or
    :data:`ASLEEP` (its CPU time still for ``seconds``)."""

    rank: int
    why: str
    seconds: float

    def words(self) -> str:
        """``rank 1 published nothing for 2.1 s (stopped, or its interpreter held)``, ``rank 1
        used no CPU for 1.5 s (asleep or blocked)``."""
        if self.why == SILENT:
            return (f"rank {self.rank} published nothing for {self.seconds:.1f} s (stopped, "
                    "or its interpreter held)")
        return f"rank {self.rank} used no CPU for {self.seconds:.1f} s (asleep or blocked)"


def stuck_reason(rank: int, record: Mapping[str, Any] | None,
                 samples: tuple[tuple[float, float], ...], now: float,
                 interval: float) -> Stuck | None:
    """Whether ``rank`` (its last record, its CPU samples) is stuck at ``now``; None when it
    is slow, in a phase, or not known to be stuck (see the module docstring)."""
    if not record or record.get("finished") or record.get("phase"):
        return None
    if "waiting for" in str(record.get("where", "")):  # its DataLoader workers: data is late
        return None
    silent = now - float(record["time"])
    if silent >= LATE_LOOK.of(interval):
        return Stuck(rank, SILENT, silent)
    if not samples:
        return None
    last_t, last_cpu = samples[-1]
    for t, cpu in reversed(samples[:-1]):
        if last_t - t >= QUIET:
            share = (last_cpu - cpu) / (last_t - t)
            return Stuck(rank, ASLEEP, last_t - t) if share < BUSY_SHARE else None
    return None


def verdict_now(learned: Learned, hang: Hang, records: Mapping[int, Mapping[str, Any] | None],
                now: float, interval: float) -> tuple[Stuck, ...]:
    """The ranks of ``hang`` that make it end the job now: every rank that never entered the
    collective, each stuck (:func:`stuck_reason`), and the hang past its first step; else
    ``()`` (the hang waits on: slow, not stuck). The caller checks the timeout."""
    found = blame(hang)
    if found.kind != NOT_ENTERED or hang.seq <= WARMUP or _phase_seen(records):
        return ()
    stuck = []
    for rank in found.ranks:
        reason = stuck_reason(rank, records.get(rank), learned.cpu.get(rank, ()), now,
                              interval)
        if reason is None:
            return ()
        stuck.append(reason)
    return tuple(stuck)
