"""How ``--hang-timeout`` ends the job (pure parts): who records first, the ending's
encoding, the bounded wait for a counter."""

from __future__ import annotations

from unirank.hang.ending import Ending, first_within, records_first, wait_for_count


def test_the_blamed_rank_records_first() -> None:
    ending = Ending("no progress", (3,))
    assert records_first(3, ending) and not records_first(0, ending)
    assert records_first(0, Ending("no progress"))  # nobody blamed: nobody waits


def test_an_ending_goes_through_the_store_as_text() -> None:
    ending = Ending("no progress for 4 s", (1, 2))
    assert Ending.decode(ending.encode()) == ending
    assert Ending.decode("rank 0 ended the job") == Ending("rank 0 ended the job")


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
