"""The hang detector's exchange (:mod:`unirank.hang.watcher`): each rank's progress record,
rank 0's requests for stacks and the answers, the end of the exchange, a failed collective; the
live view's beat and records (``unirank top``: :mod:`unirank.hang.live`)."""

from __future__ import annotations

__all__ = ["ASK_KEY", "ENDED_KEY", "FAILED_KEY", "FIRST_KEY", "LIVE_PREFIX", "PROGRESS_PREFIX",
           "REASON_KEY", "REPORTED_KEY", "STACKS_PREFIX", "STRAGGLERS_KEY", "WATCH_KEY", "live_key",
           "progress_key", "stacks_key"]

PROGRESS_PREFIX = "unirank/hang/progress/"
#: rank 0 adds 1 here to ask every rank for its stacks (the value numbers the request)
ASK_KEY = "unirank/hang/ask"
STACKS_PREFIX = "unirank/hang/stacks/"
#: counted by each rank once it recorded why the job ends (--hang-timeout)
ENDED_KEY = "unirank/hang/ended"
#: counted by each blamed rank once it recorded (the others record after it)
FIRST_KEY = "unirank/hang/blamed-recorded"
#: why the job ends (--hang-timeout): an :class:`unirank.hang.ending.Ending` as JSON
REASON_KEY = "unirank/hang/reason"
#: ranks whose collective failed count themselves here; the first reports
FAILED_KEY = "unirank/hang/failed"
REPORTED_KEY = "unirank/hang/failed-reported"
#: a live view (``unirank top``) adds 1 here at every refresh: a watcher that sees it move
#: between two of its ticks publishes its live record under :func:`live_key` every second
WATCH_KEY = "unirank/hang/watch"
LIVE_PREFIX = "unirank/hang/live/"
#: the ranks the detector names as stragglers now (:mod:`unirank.hang.slowrank`), JSON
STRAGGLERS_KEY = "unirank/hang/stragglers"


def progress_key(rank: int) -> str:
    """The key of rank ``rank``'s progress record."""
    return f"{PROGRESS_PREFIX}{rank}"


def stacks_key(number: int, rank: int) -> str:
    """The key of rank ``rank``'s answer to request ``number``."""
    return f"{STACKS_PREFIX}{number}/{rank}"


def live_key(rank: int) -> str:
    """The key of rank ``rank``'s live record (set only while a live view watches)."""
    return f"{LIVE_PREFIX}{rank}"
