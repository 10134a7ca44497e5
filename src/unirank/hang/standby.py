"""Who runs the hang detector: rank 0, or, while rank 0 publishes no progress, a standby.

Ranks 1 to ``STANDBY_RANKS - 1`` stand by: on each interval rank ``r`` reads the records of
the ranks below it (``r`` reads: O(1) per rank) and runs the detector while every one of them
is silent: its record has not changed for :func:`silent_after` seconds of this rank's own
clock (no wall clocks of two nodes are compared), or it says its program ended. So the lowest
rank that still publishes reports, and only it; when rank 0 publishes again, the standby
steps down on its next interval. A silent rank 0 is frozen (SIGSTOP, a node that stopped) or
its interpreter is held (a C call that keeps the GIL). Where rank 0 itself serves the job's
store (``unirank run``'s workers; ``ur.init`` under srun or mpirun), a frozen rank 0 freezes
the store too, and no rank can report; a held interpreter does not (the store's server runs
without the GIL), nor does anything under torchrun, whose agent serves the store.

Pure: the records come in, whether to detect goes out. Reads no environment variable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from unirank.hang.timings import SILENT

__all__ = ["STANDBY_RANKS", "Duty", "silent_after", "takeover_line"]

#: rank 0 and this many ranks minus one can run the detector
STANDBY_RANKS = 3


def silent_after(interval: float) -> float:
    """Seconds without a new record after which a rank counts as silent
    (:data:`unirank.hang.timings.SILENT`)."""
    return SILENT.of(interval)


class Duty:
    """Whether rank ``rank`` runs the detector now (see the module docstring)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        #: rank -> (its record's time, or None while it has none; when that last changed)
        self._seen: dict[int, tuple[float | None, float]] = {}

    @property
    def stands_by(self) -> bool:
        """This rank may ever run the detector."""
        return self.rank < STANDBY_RANKS

    def lower_ranks(self) -> range:
        """The ranks whose records this rank reads to decide (none for rank 0)."""
        return range(self.rank if self.stands_by else 0)

    def on_duty(self, records: Mapping[int, Mapping[str, Any] | None], now: float,
                interval: float) -> bool:
        """True when this rank runs the detector: rank 0 always, a standby while every rank
        below it is silent; ``now``: this rank's monotonic clock."""
        if not self.stands_by:
            return False
        silent = [self._silent(r, records.get(r), now, interval) for r in self.lower_ranks()]
        return all(silent)

    def _silent(self, rank: int, record: Mapping[str, Any] | None, now: float,
                interval: float) -> bool:
        if record is not None and record.get("finished"):
            return True
        stamp = None if record is None else float(record["time"])
        seen = self._seen.get(rank)
        if seen is None or seen[0] != stamp:
            self._seen[rank] = (stamp, now)
            return False
        return now - seen[1] >= silent_after(interval)


def takeover_line(rank: int, interval: float) -> str:
    """The line a standby prints before its first report (none while it has nothing to
    report: a rank 0 held a while under load is no news)."""
    lower = "rank 0 has" if rank == 1 else f"ranks 0-{rank - 1} have"
    return (f"unirank: {lower} sent no progress record for {silent_after(interval):g} s "
            f"(frozen, or its interpreter is held): rank {rank} looks for hangs instead\n")
