"""Who runs the detector (pure): rank 0; a standby while every rank below it is silent (its
record unchanged for four intervals and 6 s of the standby's clock, or its program ended)."""

from __future__ import annotations

from unirank.hang.standby import STANDBY_RANKS, Duty


def test_rank_0_always_and_ranks_past_the_standbys_never() -> None:
    assert Duty(0).on_duty({}, 0.0, 1.0)
    assert not Duty(STANDBY_RANKS).on_duty({}, 1e9, 1.0)
    assert list(Duty(STANDBY_RANKS).lower_ranks()) == []


def test_a_standby_takes_over_while_rank_0_is_silent_and_steps_down_after() -> None:
    duty = Duty(1)
    record = {"time": 100.0}
    assert not duty.on_duty({0: record}, 0.0, 1.0)
    assert not duty.on_duty({0: record}, 9.9, 1.0)  # silent for 4 intervals + 6 s: not yet
    assert duty.on_duty({0: record}, 10.0, 1.0)
    assert not duty.on_duty({0: {"time": 106.0}}, 11.0, 1.0)  # rank 0 publishes again


def test_the_lowest_publishing_rank_is_the_one() -> None:
    silent = {0: {"time": 1.0}, 1: {"time": 1.0}}
    one, two = Duty(1), Duty(2)
    for now in (0.0, 10.0):
        assert one.on_duty(silent, now, 1.0) == (now == 10.0)
        assert two.on_duty(silent, now, 1.0) == (now == 10.0)  # rank 1 silent too
    assert not two.on_duty({0: {"time": 1.0}, 1: {"time": 2.0}}, 21.0, 1.0)


def test_an_ended_program_counts_as_silent_at_once_a_missing_record_later() -> None:
    assert Duty(1).on_duty({0: {"time": 1.0, "finished": True}}, 0.0, 1.0)
    duty = Duty(1)
    assert not duty.on_duty({0: None}, 0.0, 1.0)
    assert duty.on_duty({0: None}, 10.0, 1.0)


def test_a_standby_does_not_call_a_finished_rank_0_frozen() -> None:
    """Rank 0's program ended (its last record says ``finished``): rank 1 runs the detector
    from then on, but says nothing of a frozen rank 0 (it did, into the ranks' stderr logs)."""
    import json
    import os

    from unirank.contract import HangSettings
    from unirank.hang.exchange import progress_key
    from unirank.hang.watcher import Watcher

    class Store:
        def __init__(self, values: dict[str, bytes]) -> None:
            self.values = values

        def check(self, keys: list[str]) -> bool:
            return all(k in self.values for k in keys)

        def get(self, key: str) -> bytes:
            return self.values[key]

    read_end, write_end = os.pipe()
    try:
        watcher = Watcher(rank=1, world_size=2, node="n", settings=HangSettings(60.0, None, 5.0),
                          connect=lambda: None, environ={}, err_fd=write_end)
        store = Store({progress_key(0): json.dumps({"time": 1.0, "finished": True}).encode()})
        assert watcher._check_duty(store) is True
        os.close(write_end)
        write_end = -1
        assert os.read(read_end, 1000) == b""
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
