"""Which worker of a failed attempt is the root cause, pure: plain facts in
(:class:`Ending`: how each worker ended, its failure record, how the teardown treated it),
an index out.

The root cause is the worker that failed first on its own, whatever order the exits are seen
in: its failure's time is the one it recorded (its ``TORCHELASTIC_ERROR_FILE``, written the
moment its program raised or exited, :mod:`unirank.errorfile`), else when its end was seen. A
failure recorded as a lost peer (gloo's "Connection closed by peer"...) counts only when no
worker failed on its own account, and a worker stopped by the teardown (ended by a signal it
was sent, or recorded after it was first signalled) never does. Without any such worker, the
first worker seen to fail is blamed. The run's exit code is the root cause's.

Reads no environment variable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from unirank.errorfile import RecordedFailure
from unirank.supervisor.stoppolicy import is_failure

__all__ = ["Ending", "failure_key", "root_cause"]


@dataclass(frozen=True)
class Ending:
    """How one worker ended, as the choice of the root cause sees it."""

    rank: int
    #: its exit code, or minus the signal that ended it (None: it did not end)
    returncode: int | None
    #: when (``time.time()``) the supervisor saw it end
    ended_at: float | None = None
    #: when (``time.time()``) the supervisor first signalled it to stop (None: never)
    stopped_at: float | None = None
    #: the signals the teardown sent it (SIGTERM, SIGKILL)
    stop_signals: frozenset[int] = frozenset()
    #: what its error file says (None: nothing, or it has none)
    record: RecordedFailure | None = None


def failure_key(ending: Ending) -> tuple[bool, float, int] | None:
    """How ``ending`` ranks as the root cause (lower first: not a lost peer, then the time it
    failed, then its rank), or None when it did not fail on its own (see the module
    docstring)."""
    code = ending.returncode
    if code is None or not is_failure(code):
        return None
    record = ending.record
    if record is None:
        if code < 0 and -code in ending.stop_signals:
            return None  # the teardown's signal ended it
        return (False, ending.ended_at or math.inf, ending.rank)
    if ending.stopped_at is not None and record.time > ending.stopped_at:
        return None  # it failed because the teardown stopped it
    return (record.lost_peer, record.time, ending.rank)


def root_cause(endings: Sequence[Ending], first_failure: int | None) -> int | None:
    """The index in ``endings`` of the root cause of a failed attempt (``first_failure``: the
    index of the first worker seen to fail; None: no worker failed, and no root cause)."""
    if first_failure is None:
        return None
    ranked = [(key, index) for index, ending in enumerate(endings)
              if (key := failure_key(ending)) is not None]
    if not ranked:
        return first_failure
    return min(ranked, key=lambda item: item[0])[1]
