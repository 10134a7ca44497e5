"""The hang report when a rank's program fails in a collective (torch's collective timeout,
a peer that ended), and the note its exception gets (see :mod:`unirank.hang.onstop`).

:func:`failure_report` is called by the worker's target
(:mod:`unirank.supervisor.worker.target`) or by the excepthook that
:func:`unirank.hang.watcher.excepthook_with_report` makes for :func:`unirank.init`; it works
on the rank's running watcher (:mod:`unirank.hang.watcher`), through its store connection.

Reads no environment variable.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import traceback
from typing import Any, Protocol

from unirank.contract import HangSettings
from unirank.hang.detect import find_hangs, find_uneven
from unirank.hang.exchange import FAILED_KEY, REPORTED_KEY, progress_key, read_records
from unirank.hang.onstop import report_now
from unirank.hang.render import UNEVEN_HEAD, uneven_line, wavefront_line
from unirank.hang.timings import AWAIT_REPORT, LATE_LOOK


class Watcher(Protocol):
    """What a failure's report uses of the rank's watcher
    (:class:`unirank.hang.watcher.Watcher`)."""

    settings: HangSettings
    rank: int
    world_size: int
    err_fd: int

    #: the last record published that showed this rank waiting in a collective
    last_waiting: dict[str, Any] | None
    #: the program failed in a collective: no more records
    held: bool
    #: the hang timeout ends the job: its report was made
    ending: bool
    #: the watcher's own store connection (its ops are serialised with the thread's)
    store: Any

    def hold(self, frames: list[list[Any]]) -> None: ...

    def record(self, *, fresh: bool = False) -> dict[str, Any]: ...

    def answer(self, store: Any, number: int) -> None: ...

    def answer_pending(self, store: Any) -> None: ...

__all__ = ["add_hang_note", "failure_report"]


def failure_report(watcher: Watcher, exc: BaseException) -> str | None:
    """An exception left the program (see :mod:`unirank.hang.onstop`): when it was raised
    inside torch.distributed and this rank's last record, at most
    :data:`~unirank.hang.timings.LATE_LOOK` old, showed it waiting in a collective, hold that
    record, print the hang's report if this rank is the first to fail so (the others wait
    for it, :data:`~unirank.hang.timings.AWAIT_REPORT`), and return the
    hang's wavefront (None: no hang). Raised inside torch.distributed with no such record
    (a peer's program ended, and gloo says "Connection closed by peer" at once): whether
    ranks whose program ended ran fewer collectives (:func:`~unirank.hang.detect.find_uneven`)."""
    waiting = watcher.last_waiting
    interval = watcher.settings.interval
    if isinstance(exc, SystemExit) or watcher.held or (watcher.ending and
                                                       watcher.settings.learned):
        return None  # the learned timeout's report was made: the peers' end fails the call
    frames = _traceback_frames(exc)
    if not any("/torch/distributed/" in f[0].replace(os.sep, "/") for f in frames):
        return None  # not raised inside a collective
    if waiting is None or time.time() - float(waiting["time"]) > LATE_LOOK.of(interval):
        return _uneven_note(watcher)
    watcher.hold([list(f) for f in frames])
    store = watcher.store  # its ops are serialised with the thread's; a gone store fails fast
    try:
        store.set(progress_key(watcher.rank), json.dumps(waiting))
        records = read_records(store, watcher.world_size)
        if int(store.add(FAILED_KEY, 1)) > 1:
            hangs = find_hangs(records, watcher.world_size, interval, time.time())
            _await_report(watcher, store, time.monotonic() + AWAIT_REPORT.of(interval))
            return wavefront_line(hangs[0]) if hangs else None
        try:
            made = report_now(store, watcher.world_size, interval, records=records, own=watcher,
                              cause=f"a collective failed: {type(exc).__name__}")
        finally:
            store.set(REPORTED_KEY, "1")
    except Exception:  # the store is gone: the job ends anyway
        return None
    if made is None:
        return None
    with contextlib.suppress(OSError):
        os.write(watcher.err_fd, made[0].encode(errors="replace"))
    return wavefront_line(made[1][0])


def _uneven_note(watcher: Watcher) -> str | None:
    """:func:`uneven_line` of this rank's record now and the others' in the store."""
    try:
        records = read_records(watcher.store, watcher.world_size)
        records[watcher.rank] = watcher.record(fresh=True)
    except Exception:  # the store is gone: nothing to compare
        return None
    uneven = find_uneven(records, watcher.rank)
    return None if uneven is None else uneven_line(uneven)


def _await_report(watcher: Watcher, store: Any, deadline: float) -> None:
    """Until the first failing rank has printed its report (or ``deadline``), answering
    its stack request at once (never holding the connection for long: the thread shares
    it)."""
    with contextlib.suppress(Exception):
        while not store.check([REPORTED_KEY]) and time.monotonic() < deadline:
            watcher.answer_pending(store)
            time.sleep(0.05)


def _traceback_frames(exc: BaseException) -> list[tuple[str, int, str, str]]:
    """The frames of ``exc``'s traceback, outermost first, as a stack's frames."""
    return [(f.filename, f.lineno or 0, f.name, (f.line or "").strip())
            for f in traceback.extract_tb(exc.__traceback__)]


def add_hang_note(exc: BaseException, wavefront: str | None) -> None:
    """Add the hang's wavefront to ``exc`` as a note (its traceback and error record show
    it)."""
    if not wavefront:
        return
    uneven = wavefront.startswith(UNEVEN_HEAD)  # not a hang: a peer ended before this call
    note = f"unirank: {wavefront}" if uneven else f"unirank: the ranks hung: {wavefront}"
    notes = getattr(exc, "__notes__", None)
    with contextlib.suppress(AttributeError, TypeError):
        if isinstance(notes, list):
            notes.append(note)
        else:
            exc.__notes__ = [note]
