"""How ``--hang-timeout`` ends the job: every rank records why and exits with
:data:`unirank.exitcodes.HANG_TIMEOUT`, the blamed rank first.

The supervisor blames the rank whose error record is the earliest (torchrun's root cause), so
the order of the records is the blame. The rank that runs the detector (rank 0, or a standby)
sets :data:`REASON_KEY` (an :class:`Ending`: the message, the blamed ranks from
:func:`unirank.hang.detect.blamed`, its own rank) and adds :data:`ENDING` to the stack request
counter; each rank's watcher sees it on its next interval (:func:`end_in_turn`). A blamed rank
records at once and counts itself in :data:`FIRST_KEY`; every other rank records once a
blamed rank has. Where none has within :func:`first_within` seconds (a frozen rank records
nothing), the detector's rank records and counts itself, the others after it (the message
still names the rank it blames). Each counts itself in :data:`ENDED_KEY`; a blamed rank exits
once all have (it ends first: its supervisor stops the others), the others
:data:`unirank.hang.timings.LINGER` later (ranks under another supervisor end too). Where
every blamed rank is known to be stopped (:attr:`Ending.frozen`, from the learned timeout's
:mod:`unirank.hang.learned`), no rank waits for it: each records and ends at once.

The store protocol's keys live here; the waits take the clock and the sleep as arguments.
Reads no environment variable.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from unirank.hang.timings import LATE_LOOK, LINGER
from unirank.storekeys.hang import ENDED_KEY, FIRST_KEY, REASON_KEY

__all__ = ["ENDED_KEY", "ENDING", "FIRST_KEY", "REASON_KEY", "Ending", "HangTimeoutError",
           "StragglerEvictedError", "announce_ending", "end_in_turn", "failure_of",
           "first_within", "records_first", "wait_for_count"]

#: added to the stack request counter when the job ends (``--hang-timeout``)
ENDING = 1 << 40


@dataclass(frozen=True)
class Ending:
    """Why the job ends: the message every rank records, the ranks blamed."""

    message: str
    blamed: tuple[int, ...] = ()
    #: the detector's rank, which ends the job (-1: unknown)
    by: int = -1
    #: the hang's :func:`unirank.hang.detect.verdict` (``--on-hang evict``), which every rank
    #: writes in its attempt's folder, so that every node's supervisor reads the same one
    verdict: dict[str, Any] | None = None
    #: blamed ranks known to be stopped (no record for a late look: :mod:`.learned`): no
    #: rank waits for their record, nor lingers for their supervisor
    frozen: tuple[int, ...] = ()

    def encode(self) -> str:
        return json.dumps({"message": self.message, "blamed": list(self.blamed),
                           "by": self.by, "verdict": self.verdict,
                           "frozen": list(self.frozen)})

    @classmethod
    def decode(cls, text: str) -> Ending:
        """The ending set in the store (a plain text: no rank blamed)."""
        try:
            data = json.loads(text)
            verdict = data.get("verdict")
            return cls(str(data["message"]), tuple(int(r) for r in data.get("blamed", ())),
                       int(data.get("by", -1)), verdict if isinstance(verdict, dict) else None,
                       tuple(int(r) for r in data.get("frozen", ())))
        except (ValueError, KeyError, TypeError):
            return cls(text)


class HangTimeoutError(RuntimeError):
    """The job hung longer than ``--hang-timeout`` (rank 0's recorded failure)."""


class StragglerEvictedError(HangTimeoutError):
    """``--on-slow evict`` ended the job to leave a straggler's node out (the same ending as
    a hang timeout's: its recorded failure names the straggler, not a hang)."""


def failure_of(ending: Ending, message: str) -> HangTimeoutError:
    """The failure each rank records for ``ending`` (a straggler's eviction: its verdict
    names the ``slow`` ranks, :func:`unirank.hang.slowcost.slow_verdict`)."""
    evicted = ending.verdict is not None and "slow" in ending.verdict
    return (StragglerEvictedError if evicted else HangTimeoutError)(message)


def _all_frozen(ending: Ending) -> bool:
    """Whether every blamed rank is known to be stopped (it will record nothing)."""
    return bool(ending.blamed) and set(ending.blamed) <= set(ending.frozen)


def records_first(rank: int, ending: Ending) -> bool:
    """Whether ``rank`` records at once (it is blamed, or the blamed ranks are stopped) or
    waits for a blamed rank first."""
    return rank in ending.blamed or not ending.blamed or _all_frozen(ending)


def first_within(interval: float) -> float:
    """How long the others wait for a blamed rank's record: it sees the ending on its next
    look (:data:`unirank.hang.timings.LATE_LOOK`)."""
    return LATE_LOOK.of(interval)


def wait_for_count(store: Any, key: str, count: int, timeout: float,
                   pause: Callable[[float], Any] = time.sleep,
                   clock: Callable[[], float] = time.monotonic) -> bool:
    """Until the counter ``key`` reaches ``count`` (True) or ``timeout`` seconds passed."""
    deadline = clock() + timeout
    while int(store.add(key, 0)) < count:
        if clock() >= deadline:
            return False
        pause(0.05)
    return True


def announce_ending(store: Any, ending: Ending) -> None:
    """The detector's rank tells every rank's watcher that the job ends, why, whom to blame
    (each sees it on its next look at the stack request counter)."""
    from unirank.hang.exchange import ASK_KEY

    store.set(REASON_KEY, ending.encode())
    store.add(ASK_KEY, ENDING)


def end_in_turn(store: Any, rank: int, world_size: int, interval: float, ending: Ending,
                record: Callable[[str], Any], pause: Callable[[float], Any],
                clock: Callable[[], float] = time.monotonic) -> float:
    """This rank's part of the ending: record ``ending`` (``record``) at once when blamed,
    else after a blamed rank has (or :func:`first_within` seconds), and count it; a blamed
    rank then waits until every rank recorded (it ends first: its supervisor stops the
    others). The seconds this rank lingers before it ends: none when blamed,
    :data:`~unirank.hang.timings.LINGER` for the others (ranks under another supervisor, or a
    blamed rank frozen)."""
    within = first_within(interval)
    first = records_first(rank, ending)
    if not first:  # the detector's rank comes next (a blamed rank frozen), then the others
        wait_for_count(store, FIRST_KEY, 1, within if rank == ending.by else 2 * within,
                       pause=pause, clock=clock)
    record(ending.message)
    if first or rank == ending.by:
        store.add(FIRST_KEY, 1)
    store.add(ENDED_KEY, 1)
    if rank in ending.blamed:
        wait_for_count(store, ENDED_KEY, world_size, within, pause=pause, clock=clock)
        return 0.0
    return 0.0 if _all_frozen(ending) else LINGER.of(interval)
