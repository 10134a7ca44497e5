"""torchrun 2.13's D-state timeout: a worker that stays in Linux's uninterruptible sleep (state
``D`` in ``/proc/<pid>/stat``: a wedged driver, NFS or device call) for
TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT seconds ends the attempt, and no restart follows.

What torchrun's agent does (``LocalElasticAgent._check_uninterruptible_state_timeout``, checked
by running torchrun 2.13): at each monitor tick it reads each worker's state; the first ``D``
seen starts the worker's clock (a warning), any other state stops it; a worker ``D`` for the
whole timeout is logged as an error, the group is marked UNHEALTHY, restarts are set to zero
and the workers are stopped (SIGTERM, SIGKILL after the grace period). The variable unset,
empty or not above 0 turns the check off. Only the worker's own process is looked at, not its
children. unirank run does the same, with two differences the compatibility table in
docs/run.md lists: torchrun then exits 0 (its ``launch_agent`` counts only a FAILED result as
a failure, and UNHEALTHY is not one), unirank run exits 1 and names the worker; a value that is
not a number is refused in one line (torchrun silently runs without the check).

The decision is pure (:func:`dstate_timeout`, :class:`Dwell`: states in, the stuck workers
out, with :func:`stuck_line`); :class:`DStateWatch` is the thread that reads ``/proc`` every
:data:`INTERVAL` seconds and wakes the engine through a pipe. No torch here.

Reads (from the mapping :func:`dstate_timeout` is given):
TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from unirank.contract import UNINTERRUPTIBLE_TIMEOUT_VAR, parse_seconds
from unirank.signals import start_shielded

__all__ = ["INTERVAL", "DStateWatch", "Dwell", "dstate_timeout", "read_state", "stuck_line"]

#: seconds between two looks at the workers' states (torchrun's monitor interval, 0.1)
INTERVAL = 0.1


def dstate_timeout(environ: Mapping[str, str]) -> float:
    """Seconds a worker may stay in D state; 0: no check (unset, empty or 0, as torchrun;
    torchrun also takes a negative number for 0, and so does this). Not a number: ConfigError.

    Reads: TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT.
    """
    text = environ.get(UNINTERRUPTIBLE_TIMEOUT_VAR, "").strip()
    if not text:
        return 0.0
    with contextlib.suppress(ValueError):
        if float(text) <= 0:
            return 0.0
    return parse_seconds(text, UNINTERRUPTIBLE_TIMEOUT_VAR, allow_zero=True)


def parse_state(stat: str) -> str | None:
    """The state letter of a ``/proc/<pid>/stat`` line (the field after the command's closing
    parenthesis: the command may hold spaces and parentheses); None if there is none."""
    rest = stat[stat.rfind(")") + 1:].split() if ")" in stat else []
    return rest[0] if rest else None


def read_state(pid: int) -> str | None:
    """``pid``'s state letter, or None when it cannot be read (gone, not Linux)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            return parse_state(fh.read())
    except OSError:
        return None


@dataclass
class Dwell:
    """Since when each worker has been in D state without a break (pure)."""

    timeout: float
    #: pid -> when (monotonic) it was first seen in D state, this time
    since: dict[int, float] = field(default_factory=dict)

    def step(self, states: Mapping[int, str | None], now: float) -> dict[int, float]:
        """The workers' states at ``now`` (None: unreadable, which changes nothing, as in
        torchrun): pid -> seconds in D state, for each worker that reached the timeout."""
        for pid in [p for p in self.since if p not in states]:
            del self.since[pid]
        stuck = {}
        for pid, state in states.items():
            if state is None:
                continue
            if not state.startswith("D"):
                self.since.pop(pid, None)
                continue
            first = self.since.setdefault(pid, now)
            if now - first >= self.timeout:
                stuck[pid] = now - first
        return stuck


def stuck_line(stuck: Mapping[int, float], names: Mapping[int, str], timeout: float) -> str:
    """One line for the workers that reached the timeout (``names``: pid -> ``rank 1 (local
    rank 1)``)."""
    who = ", ".join(f"{names.get(pid, 'a worker')} (pid {pid})" for pid in sorted(stuck))
    longest = max(stuck.values())
    return (f"{who} stuck in uninterruptible sleep (D state) for {longest:.1f} s (>= "
            f"{timeout:g} s, {UNINTERRUPTIBLE_TIMEOUT_VAR}); no restart")


class DStateWatch:
    """Looks at the workers' states every :data:`INTERVAL` seconds in a thread; once some
    reached the timeout, :meth:`stuck` gives the line and the pipe at :meth:`fileno` is
    readable. :meth:`close` stops it."""

    def __init__(self, timeout: float, names: Mapping[int, str],
                 alive: Callable[[], list[int]], read: Callable[[int], str | None] = read_state
                 ) -> None:
        self._dwell = Dwell(timeout)
        self._names = dict(names)
        self._alive = alive
        self._read = read
        self._line: str | None = None
        self._r, self._w = os.pipe()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="unirank-dstate", daemon=True)
        start_shielded(self._thread)

    def fileno(self) -> int:
        return self._r

    def stuck(self) -> str | None:
        """The line naming the stuck workers, once some are (None before)."""
        return self._line

    def _loop(self) -> None:
        while not self._stop.wait(INTERVAL):
            states = {pid: self._read(pid) for pid in self._alive()}
            stuck = self._dwell.step(states, time.monotonic())
            if stuck:
                self._line = stuck_line(stuck, self._names, self._dwell.timeout)
                os.write(self._w, b"!")
                return

    def close(self) -> None:
        """Stop the thread; close the pipe."""
        self._stop.set()
        self._thread.join(timeout=5)
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)
