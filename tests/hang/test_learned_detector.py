"""The detector under the learned timeout (unirank.hang.detector over unirank.hang.learned):
a fake store holds two ranks' records, the clock is the test's; which hang ends the job."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from _fakestore import FakeStore as Store
from unirank.contract import HangSettings
from unirank.hang.detector import Detector
from unirank.hang.ending import Ending
from unirank.hang.exchange import progress_key, stacks_key
from unirank.hang.learned import FLOOR, WARMUP


class Watcher:
    """Rank 0's watcher, as the detector sees it: it answers for itself, records the end."""

    def __init__(self) -> None:
        self.settings = HangSettings(60.0, None, 0.5, learned=True)
        self.rank, self.world_size = 0, 2
        self.err_fd = os.open(os.devnull, os.O_WRONLY)
        self.ended: list[Ending] = []

    def attempt_folder(self) -> str:
        return ""

    def answer(self, store: Store, number: int) -> None:
        store.set(stacks_key(number, 0), json.dumps({"rank": 0, "node": "a", "threads": []}))

    def exit_for_timeout(self, store: Store, ending: Ending) -> None:
        self.ended.append(ending)

    def write_verdict(self, found: dict[str, Any] | None) -> None:
        pass


SEQ = WARMUP + 10


def _look(detector: Detector, store: Store, t: float, rank1: dict[str, Any]) -> None:
    group = {"pg": "0", "ranks": None, "entered": SEQ, "done": SEQ - 1, "op": "all_reduce",
             "what": "float32[1]", "since": 100.0}
    store.set(progress_key(0), json.dumps({"rank": 0, "node": "a", "time": t, "where": "",
                                           "groups": [group], "cpu": 1.0}))
    store.set(progress_key(1), json.dumps(rank1))
    detector.tick(t)


def _rank1(t: float, cpu: float) -> dict[str, Any]:
    group = {"pg": "0", "ranks": None, "entered": SEQ - 1, "done": SEQ - 1, "op": "all_reduce",
             "what": "float32[1]", "since": 99.0}
    return {"rank": 1, "node": "b", "time": t, "where": "<module> (t.py:3)",
            "groups": [group], "cpu": cpu}


@pytest.mark.parametrize(("kind", "ends", "frozen"), [("asleep", True, ()),
                                                       ("stopped", True, (1,)),
                                                       ("busy", False, ())])
def test_only_a_stuck_rank_ends_the_job_past_the_floor(kind: str, ends: bool,
                                                       frozen: tuple[int, ...]) -> None:
    watcher, store = Watcher(), Store()
    detector = Detector(watcher, store)
    for step in range(40):  # 20 s of looks, every 0.5 s, from the wait's start
        t = 100.0 + step * 0.5
        published = 100.0 if kind == "stopped" else t
        _look(detector, store, t, _rank1(published, 5.0 + (t - 100.0 if kind == "busy" else 0)))
        if watcher.ended:
            assert t >= 100.0 + FLOOR  # never before the floor
            break
    assert bool(watcher.ended) == ends
    if ends:
        ending = watcher.ended[0]
        assert ending.blamed == (1,) and ending.frozen == frozen
        assert ending.verdict is not None and ending.verdict["never_entered"] == [1]
        assert "(--hang-timeout auto)" in ending.message
        # the stopped rank's stacks are not waited for
        assert (stacks_key(1, 1) in store.waited) == (kind != "stopped")
