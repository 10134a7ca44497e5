"""How ``--hang-timeout`` ends the job (pure parts): who records first, the ending's
encoding, the bounded wait for a counter."""

from __future__ import annotations

from unirank.hang.ending import (
    Ending,
    HangTimeoutError,
    StragglerEvictedError,
    failure_of,
    first_within,
    records_first,
    wait_for_count,
)


def test_the_blamed_rank_records_first() -> None:
    ending = Ending("no progress", (3,))
    assert records_first(3, ending) and not records_first(0, ending)
    assert records_first(0, Ending("no progress"))  # nobody blamed: nobody waits


def test_an_ending_goes_through_the_store_as_text() -> None:
    ending = Ending("no progress for 4 s", (1, 2), 0)
    assert Ending.decode(ending.encode()) == ending
    assert Ending.decode("rank 0 ended the job") == Ending("rank 0 ended the job")


def test_an_ending_carries_the_hang_s_verdict_to_every_rank() -> None:
    """Every rank writes it in its attempt's folder, so that every node's supervisor evicts
    by the same verdict and says it (``node evicted: rank 0 never entered all_reduce #6``)."""
    found = {"never_entered": [0], "call": "all_reduce #6"}
    ending = Ending("no progress for 5 s", (0,), 1, found)
    assert Ending.decode(ending.encode()).verdict == found
    assert Ending.decode(Ending("x", (0,), 1).encode()).verdict is None


class Counter:
    def __init__(self, counts: list[int]) -> None:
        self.counts = counts

    def add(self, key: str, amount: int) -> int:
        return self.counts.pop(0) if len(self.counts) > 1 else self.counts[0]


def test_wait_for_count_is_bounded_by_its_clock() -> None:
    clock = iter(float(t) for t in range(100))
    assert wait_for_count(Counter([0, 1, 2]), "k", 2, 10.0, pause=lambda _: None,
                          clock=lambda: next(clock))
    clock = iter(float(t) for t in range(100))
    assert not wait_for_count(Counter([0]), "k", 1, first_within(1.0), pause=lambda _: None,
                              clock=lambda: next(clock))


class Store:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, key: str, amount: int) -> int:
        self.counts[key] = self.counts.get(key, 0) + amount
        return self.counts[key]


def test_with_the_blamed_rank_frozen_the_detectors_rank_records_first() -> None:
    from unirank.hang.ending import FIRST_KEY, end_in_turn

    store, recorded, waited = Store(), [], []
    now = [0.0]

    def pause(seconds: float) -> None:
        waited.append(seconds)
        now[0] += seconds

    ending = Ending("no progress", (3,), by=1)
    linger = end_in_turn(store, 1, 4, 1.0, ending, recorded.append, pause, lambda: now[0])
    assert recorded == ["no progress"] and store.counts[FIRST_KEY] == 1  # after its wait
    assert linger == 5.0 and waited  # it waited first_within(1.0) for rank 3
    recorded.clear()
    assert end_in_turn(store, 2, 4, 1.0, ending, recorded.append, pause, lambda: now[0]) == 5.0
    assert recorded == ["no progress"] and store.counts[FIRST_KEY] == 1  # no wait: rank 1 did


def test_with_the_blamed_rank_known_stopped_nobody_waits_nor_lingers() -> None:
    """The learned timeout knows a stopped rank (no record for a late look): no rank waits
    for its record, and none lingers for its supervisor."""
    from unirank.hang.ending import FIRST_KEY, end_in_turn

    store, recorded, waited = Store(), [], []
    ending = Ending("no progress", (3,), by=0, frozen=(3,))
    assert Ending.decode(ending.encode()) == ending
    assert records_first(2, ending)
    linger = end_in_turn(store, 2, 4, 1.0, ending, recorded.append, waited.append,
                         lambda: 0.0)
    assert (linger, waited, recorded) == (0.0, [], ["no progress"])
    assert store.counts[FIRST_KEY] == 1


def test_a_straggler_s_eviction_is_recorded_as_such_a_hang_as_a_hang() -> None:
    """The failure each rank records: the summary's ``error:`` line names the cause (an
    eviction under --on-slow evict is not a hang, though it ends the job the same way)."""
    slow = Ending("rank 1 kept the others waiting", (1,), 0,
                  {"slow": [1], "straggler": 1, "share": 0.8})
    hang = Ending("no progress for 3 s", (1,), 0, {"evict": [1]})
    assert type(failure_of(slow, "m")) is StragglerEvictedError
    assert type(failure_of(hang, "m")) is HangTimeoutError
    assert type(failure_of(Ending("m"), "m")) is HangTimeoutError
    assert isinstance(failure_of(slow, "m"), HangTimeoutError)  # caught as one still
