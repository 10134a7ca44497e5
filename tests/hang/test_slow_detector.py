"""The detector names a straggler while the job runs (unirank.hang.detector over
unirank.hang.slowrank): a fake store holds two ranks' records, the clock is the test's; one
line on rank 0's stderr per change, the named ranks in the store for every rank."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from _fakestore import FakeStore as Store
from unirank.contract import HangSettings
from unirank.hang.detector import Detector
from unirank.hang.ending import Ending
from unirank.hang.exchange import progress_key
from unirank.hang.slowrank import read_named
from unirank.hang.straggle import Straggler
from unirank.storekeys.hang import STRAGGLERS_KEY


class Watcher:
    """Rank 0's watcher, as the detector sees it (no hang here: nothing else is asked)."""

    def __init__(self, err_fd: int) -> None:
        self.settings = HangSettings(60.0, None, 5.0)
        self.rank, self.world_size, self.err_fd = 0, 2, err_fd

    def attempt_folder(self) -> str:
        return ""


def _records(store: Store, t: float, slow: bool) -> None:
    """Rank 1 never waits; rank 0 waits 60 % of the time while ``slow``, else as rank 1."""
    group = {"pg": "0", "ranks": None, "entered": int(t), "done": int(t), "op": "all_reduce",
             "since": t}
    waited = 0.6 * t if slow else 0.0
    for rank, in_s in ((0, waited), (1, 0.0)):
        store.set(progress_key(rank), json.dumps({
            "rank": rank, "node": f"node{rank}", "time": t, "where": "", "groups": [group],
            "in_s": in_s}))


def _recover(store: Store, detector: Detector) -> None:
    """Looks 5 to 8 (after :func:`_records` named rank 1 over looks 0 to 4): rank 0 stops
    waiting (its ``in_s`` no longer grows)."""
    base = 0.6 * 20.0
    for look in range(5, 9):
        t = 5.0 * look
        _records(store, t, slow=False)
        record = json.loads(store.data[progress_key(0)])
        record["in_s"] = base
        store.set(progress_key(0), json.dumps(record))
        detector.tick(t)


def test_the_detector_says_each_change_once_and_keeps_the_named(tmp_path: Path) -> None:
    err = tmp_path / "err"
    store, watcher = Store(), Watcher(os.open(err, os.O_WRONLY | os.O_CREAT))
    detector = Detector(watcher, store)  # type: ignore[arg-type]
    for look in range(5):  # named at the third look: two windows of 5 s
        _records(store, 5.0 * look, slow=True)
        detector.tick(5.0 * look)
    assert read_named(store) == (Straggler(1, "node1", 0.6),)
    _recover(store, detector)  # rank 0 stops waiting: the windows no longer name rank 1
    os.close(watcher.err_fd)
    assert err.read_text().splitlines() == [
        "unirank: straggler: rank 1 (node1) keeps the others waiting 60 % of the time "
        "(last 10 s)",
        "unirank: straggler: rank 1 (node1) no longer keeps the others waiting (last 10 s)"]
    assert read_named(store) == ()


def test_the_named_are_in_the_store_before_the_line_says_so(tmp_path: Path) -> None:
    """Whoever reads the line (a test, a person who then asks ``ur.elastic_state()``) finds
    the rank named in the store already."""
    err = tmp_path / "err"

    class Noting(Store):
        def set(self, key: str, value: str) -> None:
            if key == STRAGGLERS_KEY:
                lines_before.append(err.read_text())
            super().set(key, value)

    lines_before: list[str] = []
    store, watcher = Noting(), Watcher(os.open(err, os.O_WRONLY | os.O_CREAT))
    detector = Detector(watcher, store)  # type: ignore[arg-type]
    for look in range(5):
        _records(store, 5.0 * look, slow=True)
        detector.tick(5.0 * look)
    os.close(watcher.err_fd)
    assert lines_before == [""]
    assert "unirank: straggler: rank 1 " in err.read_text()


class Evicting(Watcher):
    """Rank 0's watcher under ``--on-slow evict``: the ending and the verdict kept, not acted."""

    def __init__(self, err_fd: int) -> None:
        super().__init__(err_fd)
        self.settings = HangSettings(60.0, None, 5.0, on_slow="evict")
        self.endings: list[Ending] = []
        self.verdicts: list[dict[str, Any] | None] = []

    def write_verdict(self, found: dict[str, Any] | None) -> None:
        self.verdicts.append(found)

    def exit_for_timeout(self, store: Store, ending: Ending) -> None:
        self.endings.append(ending)


def _run_slow(watcher: Watcher, share: float) -> Store:
    """Five looks in which rank 0 waits ``share`` of the time for rank 1."""
    store = Store()
    detector = Detector(watcher, store)  # type: ignore[arg-type]
    for look in range(5):
        t = 5.0 * look
        _records(store, t, slow=True)
        record = json.loads(store.data[progress_key(0)])
        record["in_s"] = share * t
        store.set(progress_key(0), json.dumps(record))
        detector.tick(t)
    return store


def test_on_slow_evict_ends_the_job_naming_the_straggler_s_node(tmp_path: Path) -> None:
    watcher = Evicting(os.open(tmp_path / "err", os.O_WRONLY | os.O_CREAT))
    _run_slow(watcher, 0.8)
    os.close(watcher.err_fd)
    [ending] = watcher.endings
    assert ending.blamed == (1,) and ending.verdict == watcher.verdicts[0]
    assert ending.message == ("rank 1 (node1) kept the others waiting 80 % of the time: its "
                              "node is evicted (--on-slow evict, exit code 86)")
    assert ending.verdict is not None and ending.verdict["slow"] == [1]


def test_on_slow_evict_keeps_a_node_whose_eviction_does_not_pay(tmp_path: Path) -> None:
    watcher = Evicting(os.open(tmp_path / "err", os.O_WRONLY | os.O_CREAT))
    store = _run_slow(watcher, 0.5)
    os.close(watcher.err_fd)
    assert read_named(store) == (Straggler(1, "node1", 0.5),)  # named, and kept
    assert watcher.endings == [] and watcher.verdicts == []


def test_every_rank_says_the_stragglers_the_store_holds_also_a_standby_on_duty() -> None:
    """Rank 1 takes the detector over once rank 0's program ended; its own detector has named
    no one, and ``ur.elastic_state().stragglers`` still says what rank 0 named."""
    from unirank.hang.slowrank import encode_named
    from unirank.hang.slowrank import observe as observe_slow
    from unirank.hang.watcher import Watcher as RankWatcher

    store = Store()
    named = Detector(Watcher(2), store).slow  # type: ignore[arg-type]
    for look in range(5):
        _records(store, 5.0 * look, slow=True)
        named, _ = observe_slow(named, json_records(store), False)
    store.set(STRAGGLERS_KEY, encode_named(named))
    standby = RankWatcher(rank=1, world_size=2, node="node1",
                          settings=HangSettings(60.0, None, 5.0), connect=lambda: store,
                          environ={})
    standby.store = store
    record = json.loads(store.data[progress_key(0)])
    store.set(progress_key(0), json.dumps({**record, "finished": True}))
    standby.detector = Detector(standby, store)
    assert standby._check_duty(store)  # rank 0 ended: rank 1 runs the detector
    assert standby.stragglers() == (Straggler(1, "node1", 0.6),)


def json_records(store: Store) -> dict[int, dict[str, Any] | None]:
    return {rank: json.loads(store.data[progress_key(rank)]) for rank in (0, 1)}


def test_the_program_s_hang_keywords_keep_the_supervisor_s_on_slow() -> None:
    """``ur.init(hang_timeout=...)`` reconfigures the bootstrap's watcher after the bootstrap
    removed UNIRANK_ON_SLOW from the environment: the attempt's ``evict`` stays."""
    from unirank.hang.watcher import Watcher as RankWatcher

    watcher = RankWatcher(rank=0, world_size=2, node="node0",
                          settings=HangSettings(60.0, None, 5.0, on_slow="evict"),
                          connect=Store, environ={})
    watcher.reconfigure(HangSettings(30.0, 90.0, 2.0))
    assert (watcher.settings.report_after, watcher.settings.timeout) == (30.0, 90.0)
    assert watcher.settings.on_slow == "evict"


def test_a_detector_taking_over_starts_from_the_named_and_says_when_they_recover(
        tmp_path: Path) -> None:
    """A standby going on duty (rank 0 gone quiet) reads the ranks rank 0 named from the store:
    once the straggler recovers it says so and the store forgets it (before, a standby
    started empty and the store kept the name until the standby named someone)."""
    err = tmp_path / "err"
    store, watcher = Store(), Watcher(os.open(err, os.O_WRONLY | os.O_CREAT))
    first = Detector(watcher, store)  # type: ignore[arg-type]
    for look in range(5):
        _records(store, 5.0 * look, slow=True)
        first.tick(5.0 * look)
    assert read_named(store) == (Straggler(1, "node1", 0.6),)
    standby = Detector(watcher, store)  # type: ignore[arg-type]
    standby.take_over()
    _recover(store, standby)
    os.close(watcher.err_fd)
    assert err.read_text().splitlines()[-1] == \
        "unirank: straggler: rank 1 (node1) no longer keeps the others waiting (last 10 s)"
    assert read_named(store) == ()
