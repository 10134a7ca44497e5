"""A rank's live record (:mod:`unirank.hang.live`): made from its last progress record and the
recorder's status now; published only while a view's beat moves between two ticks."""

from __future__ import annotations

import json
from typing import Any

from unirank.hang.live import LIVE_PERIOD, Live, live_record, restart_of
from unirank.hang.waits import WaitMeter
from unirank.storekeys.hang import WATCH_KEY, live_key


class Store:
    """The calls of a TCPStore the watcher makes, on a dict."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.sets = 0

    def add(self, key: str, amount: int) -> int:
        self.data[key] = int(self.data.get(key, 0)) + amount
        return int(self.data[key])

    def set(self, key: str, value: str) -> None:
        self.sets += 1
        self.data[key] = value


BASE = {"rank": 2, "node": "nodeA", "time": 100.0, "where": "train (t.py:3)", "finished": False,
        "groups": [{"pg": "0", "ranks": None, "entered": 12, "done": 11, "op": "all_reduce",
                    "what": "float32[4]", "since": 99.5, "calls": [[11, "all_reduce", "", ""]]}]}


def status(entered: int, done: int) -> dict[str, Any]:
    return {"0": {"last_enqueued_collective": entered, "last_completed_collective": done}}


def test_the_record_takes_the_numbers_now_and_the_op_where_still_the_same() -> None:
    seen: dict[str, tuple[int, float]] = {}
    same = live_record(BASE, status(12, 12), 101.0, seen, in_s=0.5, restart=1)
    assert same["groups"] == [{"pg": "0", "ranks": None, "entered": 12, "done": 12,
                               "op": "all_reduce", "since": 99.5}]
    assert (same["time"], same["in_s"], same["restart"], same["where"]) == (
        101.0, 0.5, 1, "train (t.py:3)")
    moved = live_record(BASE, status(15, 14), 102.0, seen, in_s=None, restart=1)
    assert moved["groups"][0] | {} == {"pg": "0", "ranks": None, "entered": 15, "done": 14,
                                        "op": "", "since": 102.0}
    later = live_record(BASE, status(15, 15), 103.0, seen, in_s=None, restart=1)
    assert later["groups"][0]["since"] == 102.0  # first seen, not each time
    assert live_record(BASE, None, 104.0, seen, in_s=None, restart=0)["groups"][0][
        "entered"] == 12


def test_nothing_is_published_until_the_beat_moves_between_two_ticks() -> None:
    store, live = Store(), Live(2, 0)
    live.tick(store)
    live.publish(store, BASE, None)
    live.tick(store)
    live.publish(store, BASE, None)
    assert store.sets == 0 and live.period(None) is None
    store.add(WATCH_KEY, 1)  # a view's refresh
    live.tick(store)
    live.publish(store, BASE, WaitMeter(in_s=1.25))
    assert json.loads(store.data[live_key(2)])["in_s"] == 1.25
    assert live.period(None) == LIVE_PERIOD and live.period(0.05) == 0.05
    live.tick(store)  # no refresh since: the view is gone
    assert not live.watched


def test_between_ticks_a_record_every_period_only() -> None:
    store, live = Store(), Live(0, 0)
    live.tick(store)
    store.add(WATCH_KEY, 1)
    live.tick(store)
    live.publish(store, BASE, None)
    live.look(store, 0.0, None)  # the clock of look is monotonic: not due yet
    sets = store.sets
    live.look(store, 10.0 ** 9, None)
    assert store.sets == sets + 1


def test_the_restart_count_from_the_environment() -> None:
    assert restart_of({"TORCHELASTIC_RESTART_COUNT": "3"}) == 3
    assert restart_of({}) == 0 and restart_of({"TORCHELASTIC_RESTART_COUNT": "x"}) == 0


def test_the_progress_record_gets_the_waits_and_the_restart() -> None:
    record = dict(BASE)
    Live(2, 4).stamp(record, WaitMeter(in_s=2.0))
    assert (record["in_s"], record["restart"]) == (2.0, 4)


def test_a_watcher_publishes_its_live_record_at_its_tick_once_a_view_beats() -> None:
    """The watcher's wiring: nothing under the live key until a view's beat moves between two
    of its ticks; its progress records carry the restart count either way."""
    from unirank.contract import HangSettings
    from unirank.hang.exchange import progress_key
    from unirank.hang.watcher import Watcher

    store = Store()
    watcher = Watcher(rank=5, world_size=8, node="nodeB", settings=HangSettings(60.0, None, 5.0),
                      connect=lambda: store, environ={"TORCHELASTIC_RESTART_COUNT": "2"})
    watcher._tick(store)
    watcher._tick(store)
    assert live_key(5) not in store.data
    assert json.loads(store.data[progress_key(5)])["restart"] == 2
    store.add(WATCH_KEY, 1)
    watcher._tick(store)
    live = json.loads(store.data[live_key(5)])
    assert (live["rank"], live["node"], live["restart"], live["in_s"]) == (5, "nodeB", 2, None)
