"""The learned hang timeout and stuck versus slow (unirank.hang.learned): records in, pure."""

from __future__ import annotations

from typing import Any

import pytest

from unirank.contract import HANG_TIMEOUT_AUTO, LEARNED_INTERVAL, resolve_hang
from unirank.errors import ConfigError
from unirank.hang.detect import find_hangs
from unirank.hang.learned import (
    ASLEEP,
    FACTOR,
    FLOOR,
    QUIET,
    SILENT,
    WARMUP,
    Learned,
    observe,
    stuck_reason,
    timeout_now,
    verdict_now,
)
from unirank.hang.phases import current, phase
from unirank.hang.timings import LATE_LOOK

INTERVAL = 0.5


def rec(rank: int, t: float, entered: int, done: int, since: float | None = None,
        cpu: float | None = None, **extra: Any) -> dict[str, Any]:
    group = {"pg": "0", "ranks": None, "entered": entered, "done": done, "op": "all_reduce",
             "what": "float32[1]", "since": since}
    record: dict[str, Any] = {"rank": rank, "node": f"n{rank}", "time": t, "where": "",
                              "groups": [group], **extra}
    if cpu is not None:
        record["cpu"] = cpu
    return record


def test_the_timeout_is_the_floor_until_a_slow_wait_completed() -> None:
    learned = Learned()
    assert timeout_now(learned) == FLOOR
    seq = WARMUP + 5
    learned = observe(learned, {0: rec(0, 101.0, seq, seq - 1, since=100.0)})
    learned = observe(learned, {0: rec(0, 102.5, seq, seq - 1, since=100.0)})
    assert timeout_now(learned) == FLOOR  # in flight: it teaches nothing yet
    learned = observe(learned, {0: rec(0, 103.0, seq + 1, seq, since=102.9)})
    assert learned.slowest == 2.5
    assert timeout_now(learned) == FACTOR * 2.5


def test_the_first_step_and_phases_teach_nothing() -> None:
    learned = observe(Learned(), {0: rec(0, 120.0, WARMUP, WARMUP - 1, since=100.0)})
    learned = observe(learned, {0: rec(0, 121.0, WARMUP + 1, WARMUP, since=120.9)})
    assert learned.slowest == 0.0  # a 20 s compile of the first step
    seq = WARMUP + 3
    learned = observe(learned, {0: rec(0, 140.0, seq, seq - 1, since=125.0),
                                1: rec(1, 140.0, seq - 1, seq - 1, phase="eval")})
    learned = observe(learned, {0: rec(0, 141.0, seq + 1, seq, since=140.9),
                                1: rec(1, 141.0, seq + 1, seq)})
    assert learned.slowest < 1.0  # rank 1 evaluated on purpose: its 15 s taught nothing


def samples(*pairs: tuple[float, float]) -> tuple[tuple[float, float], ...]:
    return tuple(pairs)


def test_a_rank_whose_cpu_moves_is_slow_not_stuck() -> None:
    record = rec(1, 110.0, 20, 20, cpu=9.0)
    busy = samples((108.0, 7.0), (109.0, 8.0), (110.0, 9.0))
    assert stuck_reason(1, record, busy, 110.2, INTERVAL) is None
    asleep = samples((108.0, 7.0), (109.0, 7.0), (110.0, 7.0))
    found = stuck_reason(1, record, asleep, 110.2, INTERVAL)
    assert found is not None and found.why == ASLEEP and found.seconds == 2.0
    assert "used no CPU for 2.0 s" in found.words()


def test_too_short_a_quiet_spell_decides_nothing() -> None:
    record = rec(1, 110.0, 20, 20, cpu=7.0)
    short = samples((110.0 - QUIET / 2, 7.0), (110.0, 7.0))
    assert stuck_reason(1, record, short, 110.1, INTERVAL) is None


def test_a_silent_rank_is_stuck_even_without_samples() -> None:
    record = rec(1, 100.0, 20, 20)
    late = 100.0 + LATE_LOOK.of(INTERVAL)
    found = stuck_reason(1, record, (), late, INTERVAL)
    assert found is not None and found.why == SILENT
    assert "published nothing" in found.words()
    assert stuck_reason(1, record, (), late - 0.1, INTERVAL) is None


@pytest.mark.parametrize("extra", [{"phase": "save_state"}, {"finished": True},
                                   {"where": "step (t.py:3), waiting for a DataLoader worker"}])
def test_a_phase_an_ended_program_or_late_data_is_never_stuck(extra: dict[str, Any]) -> None:
    record = rec(1, 100.0, 20, 20, **extra)
    assert stuck_reason(1, record, (), 200.0, INTERVAL) is None


def _hang(records: dict[int, dict[str, Any] | None], now: float) -> Any:
    hangs = find_hangs(records, 2, 1.0, now)
    assert len(hangs) == 1
    return hangs[0]


def test_the_verdict_names_the_stuck_rank_past_the_first_step() -> None:
    seq = WARMUP + 4
    flat = [{0: rec(0, t, seq, seq - 1, since=100.0, cpu=1.0),
             1: rec(1, t, seq - 1, seq - 1, cpu=5.0)} for t in (101.0, 102.0, 103.0)]
    learned = Learned()
    for records in flat:
        learned = observe(learned, records)
    hang = _hang(flat[-1], 103.2)
    stuck = verdict_now(learned, hang, flat[-1], 103.2, INTERVAL)
    assert [(s.rank, s.why) for s in stuck] == [(1, ASLEEP)]
    # the same at the first step: nothing
    early = {0: rec(0, 103.0, 1, 0, since=100.0, cpu=1.0), 1: rec(1, 103.0, 0, 0, cpu=5.0)}
    assert verdict_now(learned, _hang(early, 103.2), early, 103.2, INTERVAL) == ()
    # a rank anywhere in a phase: nothing
    phased = {0: rec(0, 103.0, seq, seq - 1, since=100.0, cpu=1.0, phase="checkpoint"),
              1: rec(1, 103.0, seq - 1, seq - 1, cpu=5.0)}
    assert verdict_now(learned, _hang(phased, 103.2), phased, 103.2, INTERVAL) == ()


def test_auto_is_the_elastic_default_and_a_static_job_keeps_none() -> None:
    elastic = resolve_hang(None, None, {}, elastic=True)
    assert (elastic.learned, elastic.timeout, elastic.interval) == (True, None,
                                                                   LEARNED_INTERVAL)
    assert elastic.report_after == 60.0  # slow ranks are reported as before
    static = resolve_hang(None, None, {})
    assert (static.learned, static.timeout, static.interval) == (False, None, 5.0)
    asked = resolve_hang(None, "auto", {})
    assert asked.learned and asked.environ()["UNIRANK_HANG_TIMEOUT"] == HANG_TIMEOUT_AUTO
    assert resolve_hang(None, None, asked.environ()).learned  # the workers read it back
    assert resolve_hang(None, None, {"UNIRANK_ELASTIC": "1"}).learned


def test_a_number_or_off_keeps_its_meaning_in_an_elastic_job() -> None:
    fixed = resolve_hang(None, "6", {}, elastic=True)
    assert (fixed.learned, fixed.timeout) == (False, 6.0)
    off = resolve_hang(None, "off", {}, elastic=True)
    assert (off.learned, off.timeout) == (False, None)
    worker = {**off.environ(), "UNIRANK_ELASTIC": "1"}  # what an elastic job's worker reads
    assert not resolve_hang(None, None, worker).learned
    no_detector = resolve_hang("off", None, {}, elastic=True)
    assert not no_detector.learned
    with pytest.raises(ConfigError, match="--hang-timeout='soon'"):
        resolve_hang(None, "soon", {}, elastic=True)


def test_phases_nest_and_name_the_innermost() -> None:
    assert current() == ""
    with phase("eval"):
        with phase("save_state"):
            assert current() == "save_state"
        assert current() == "eval"
    assert current() == ""
    with pytest.raises(ValueError, match="non-empty"), phase(" "):
        pass


def test_the_docs_state_the_rule_s_numbers() -> None:
    """docs/run.md's rule says the module's numbers (the one home of each)."""
    from pathlib import Path

    from unirank.hang.learned import BUSY_SHARE

    text = " ".join((Path(__file__).resolve().parents[2] / "docs" / "run.md").read_text()
                    .split())
    assert f"the larger of {FLOOR:g} s and {FACTOR:g} times the slowest wait" in text
    assert f"The job's first {WARMUP} collectives of each group" in text
    assert f"past the first {WARMUP} collectives" in text
    assert f"less than {BUSY_SHARE:.0%} of a core over the last {QUIET:g} s" in text
    assert f"every {LEARNED_INTERVAL:g} s" in text
