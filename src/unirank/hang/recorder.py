"""What a rank's records are read from: torch's flight recorder, turned on before the first
group starts (:func:`enable_recorder`), read by :class:`Recorder`, with the user's line of
each waiting collective seen by :class:`Sites`.

Reads no environment variable; puts TORCH_FR_BUFFER_SIZE in the C environment (set to
:data:`RECORDER_ENTRIES` when the program's environment does not set it, before the program
starts its group; taken out again once a group started).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from unirank.hang.progress import HISTORY, frames_of, site_of, user_frame
from unirank.hang.waits import recorder_status, recorder_trace, settle

__all__ = ["ENTRIES_EVERY", "RECORDER_ENTRIES", "RECORDER_VAR", "Recorder", "Sites",
           "enable_recorder", "recorder_started"]

#: torch's flight recorder: how many collectives it keeps (its ring buffer)
RECORDER_VAR = "TORCH_FR_BUFFER_SIZE"
#: non-empty while :func:`enable_recorder` has put the recorder's size in the C environment
_RECORDER_PUT: list[bool] = []
RECORDER_ENTRIES = 64
#: seconds between two reads of the recorder's entries while no collective waits
ENTRIES_EVERY = 2.0


def enable_recorder(environ: Mapping[str, str]) -> None:
    """Turn torch's flight recorder on (before the first group starts), unless the program's
    environment sets its size already: in the C environment only (``os.putenv``), which torch
    reads when the first group starts, so that the program's ``os.environ`` stays torchrun's;
    :func:`recorder_started` takes it out again."""
    if RECORDER_VAR not in environ and not _RECORDER_PUT:
        os.putenv(RECORDER_VAR, str(RECORDER_ENTRIES))
        _RECORDER_PUT.append(True)


def recorder_started() -> None:
    """A group started (torch has read the recorder's size): take the size out of the C
    environment again, so that no process the program starts inherits it."""
    if _RECORDER_PUT:
        os.unsetenv(RECORDER_VAR)
        _RECORDER_PUT.clear()


class Recorder:
    """Reads the flight recorder for this rank's records: the groups' status every time (a C
    call of microseconds), the entries (:func:`recorder_trace`, about 2 ms) while a collective
    waits, for the last record, and when the status changed at least :data:`ENTRIES_EVERY`
    seconds after they were last read.

    Imports nothing: the program's first ``import torch`` is its own (see
    :mod:`unirank.supervisor.worker.lateenv`), and torch's C module is loaded with it."""

    def __init__(self) -> None:
        self._key: tuple[tuple[str, int, int], ...] | None = None
        self._trace: Mapping[str, Any] = {}
        self._read_at = -math.inf

    def read(self, *, last: bool = False) -> dict[str, Any] | None:
        """The dump; {} before torch.distributed is loaded; None where torch cannot give it."""
        if "torch.distributed" not in sys.modules:
            return {}
        status = recorder_status()
        if status is None:
            return None
        try:
            key = tuple(sorted((str(pg), int(g.get("last_enqueued_collective", -1)),
                                int(g.get("last_completed_collective", -1)))
                               for pg, g in status.items()))
        except (TypeError, ValueError, AttributeError):
            return None
        now = time.monotonic()
        waiting = any(entered > done for _, entered, done in key)
        if waiting or (key != self._key and (last or now - self._read_at >= ENTRIES_EVERY)):
            trace = recorder_trace()
            if trace is not None:
                self._key, self._trace, self._read_at = key, trace, now
                status = settle(status)  # by the entries just read
        # entries read before the status changed are still true of the collectives they name
        entries = list(self._trace.get("entries", ()) or ())
        return {"pg_status": status, "entries": entries,
                "pg_config": self._trace.get("pg_config", {}) or {}}


@dataclass
class Sites:
    """The user's line behind each group's waiting collective, seen once per collective (the
    last :data:`~unirank.hang.progress.HISTORY` of each group kept for the records' calls)."""

    skip: tuple[str, ...] = ()
    seen: dict[str, dict[int, str]] = field(default_factory=dict)

    def fill(self, groups: list[dict[str, Any]], frames: Mapping[int, Any]) -> None:
        for group in groups:
            known = self.seen.setdefault(group["pg"], {})
            seq = group["entered"]
            if seq not in known:
                site = ""
                if group["entered"] > group["done"] and group.get("thread"):
                    with contextlib.suppress(ValueError):
                        frame = frames.get(int(group["thread"]))
                        site = site_of(user_frame(frames_of(frame), self.skip))
                known[seq] = site
                for old in sorted(known)[:-HISTORY]:
                    del known[old]
            if not group.get("site"):
                group["site"] = known[seq]
            for call in group.get("calls", ()):
                if not call[3]:
                    call[3] = known.get(call[0], "")
