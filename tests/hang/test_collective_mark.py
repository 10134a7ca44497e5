"""The mark of a rank that waits in one collective (:class:`unirank.hang.waits.CollectiveMark`),
kept from the watcher's looks (:meth:`WaitMeter.waiting_for`), for its supervisor when a node
is gone: looks given as data, the mark a file in the test's folder."""

from __future__ import annotations

from pathlib import Path

from unirank.hang.waits import MARK_AFTER, CollectiveMark, WaitMeter
from unirank.runfolder import AttemptFolder


def status(entered: int, done: int) -> dict[str, dict[str, str]]:
    return {"0": {"last_enqueued_collective": str(entered),
                  "last_completed_collective": str(done)}}


def test_the_wait_counts_from_the_first_look_in_the_same_collectives() -> None:
    meter = WaitMeter()
    meter.look(1.0, status(1, 0))
    assert meter.waiting_for(1.0) == 0.0
    meter.look(2.5, status(1, 0))
    assert meter.waiting_for(2.5) == 1.5
    meter.look(3.0, status(2, 1))  # one completed, the next entered: a new wait
    assert meter.waiting_for(3.0) == 0.0
    meter.look(3.5, status(2, 2))  # none in flight
    assert meter.waiting_for(4.0) == 0.0


def test_the_mark_is_kept_from_mark_after_seconds_and_removed_after(tmp_path: Path) -> None:
    path = AttemptFolder(str(tmp_path)).collective_mark(3)
    assert path.endswith("in-collective.3")
    mark = CollectiveMark(path)
    mark.update(MARK_AFTER / 2)
    assert not Path(path).exists()
    mark.update(MARK_AFTER)
    assert Path(path).exists() and mark.kept
    mark.update(MARK_AFTER * 5)
    assert Path(path).exists()
    mark.update(0.0)
    assert not Path(path).exists() and not mark.kept


def test_without_a_folder_nothing_is_written() -> None:
    mark = CollectiveMark("")
    mark.update(MARK_AFTER * 2)
    assert not mark.kept


def test_a_long_wait_is_confirmed_from_the_entries_once_before_it_is_marked() -> None:
    """:meth:`WaitMeter.to_confirm`: a look reads the recorder's entries (2 ms, not
    microseconds) once per wait that lasted MARK_AFTER, so that a status left behind by
    collectives retired out of order (:func:`unirank.hang.waits.completed`) is not marked."""
    meter = WaitMeter()
    meter.look(1.0, status(4, 2))
    assert not meter.to_confirm(1.0 + MARK_AFTER / 2)
    assert meter.to_confirm(1.0 + MARK_AFTER)
    assert not meter.to_confirm(1.0 + MARK_AFTER * 3)  # this wait was confirmed already
    meter.look(9.0, status(5, 4))  # a new wait: confirmed again once it lasted
    assert not meter.to_confirm(9.0)
    assert meter.to_confirm(9.0 + MARK_AFTER)
    meter.look(20.0, status(5, 5))  # none in flight
    assert not meter.to_confirm(30.0)
