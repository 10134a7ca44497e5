"""The hang detector's waits, each derived here from the watchers' interval (the one home of
each number; the docs' sentences that state them are checked against these by
tests/hang/test_timings.py).

Every rank's watcher looks at the store once per interval (``UNIRANK_HANG_INTERVAL``,
:attr:`unirank.contract.HangSettings.interval`); a look may come one interval late (the
tick before it took long: a report's wait, a slow store), so "every watcher has looked once
more" is two intervals. Each wait below is some intervals and some seconds:

* :data:`ANSWER`: how long a report (rank 0's detector, ``unirank stacks``) waits for every
  rank's stacks: two looks and 3 s for the answers to cross the store;
* :data:`STOP_ANSWER`: the same wait for the report at a stop signal or a failed collective
  (:mod:`.onstop`), kept short because a signal waits for it: one look and 2 s;
* :data:`LATE_LOOK`: the longest a watcher may take to see something new in the store (its
  next look, one late, and a second): how long the ranks wait for a blamed rank's record when
  the job ends (:mod:`.ending`), and how old a rank's record may be to say where it waited
  when its collective failed (:mod:`.failure`);
* :data:`AWAIT_REPORT`: how long the other ranks whose collective failed wait for the first
  one's report before they exit (its :data:`STOP_ANSWER` wait and 2 s to print it);
* :data:`LINGER`: how long the ranks that are not blamed stay after they recorded the ending:
  a late look and 2 s, so that the blamed rank ends first (its supervisor then stops them);
* :data:`SILENT`: how long a rank's record may stay the same before a standby takes the
  detector over (:mod:`.standby`): longer than a healthy detector's tick may keep its watcher
  from publishing (a report's :data:`ANSWER` wait), twice over.

Pure; imports nothing of unirank; reads no environment variable.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ANSWER", "AWAIT_REPORT", "LATE_LOOK", "LINGER", "SILENT", "STOP_ANSWER", "Timing"]

_COUNTS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight")


@dataclass(frozen=True)
class Timing:
    """A wait of ``intervals`` watcher intervals and ``seconds`` more."""

    intervals: int
    seconds: float

    def of(self, interval: float) -> float:
        """The wait, in seconds, for watchers that look every ``interval`` seconds."""
        return self.intervals * interval + self.seconds

    def words(self) -> str:
        """The wait as help texts and the docs say it: ``two intervals and 3 s``."""
        unit = "interval" if self.intervals == 1 else "intervals"
        return f"{_COUNTS[self.intervals]} {unit} and {self.seconds:g} s"

    def interval_for(self, seconds: float) -> float:
        """The interval at which this wait lasts ``seconds`` (to check a doc's example)."""
        return (seconds - self.seconds) / self.intervals


#: a rank's watcher sees what is new in the store on its next look, which may be one late
LATE_LOOK = Timing(2, 1.0)
#: the wait for every rank's stacks of a report (rank 0's detector, ``unirank stacks``)
ANSWER = Timing(2, 3.0)
#: the wait for every rank's stacks of the report at a stop signal or a failed collective
STOP_ANSWER = Timing(1, 2.0)
#: the wait of the other failing ranks for the first one's report (:mod:`.failure`)
AWAIT_REPORT = Timing(STOP_ANSWER.intervals, STOP_ANSWER.seconds + 2.0)
#: the stay of a rank that is not blamed, once it recorded the ending: the blamed one ends first
LINGER = Timing(LATE_LOOK.intervals, LATE_LOOK.seconds + 2.0)
#: no new record for this long: a rank counts as silent (frozen, or its interpreter held)
SILENT = Timing(2 * ANSWER.intervals, 2 * ANSWER.seconds)
