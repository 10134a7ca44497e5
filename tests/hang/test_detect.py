"""The detector (pure): which records are a hang, the wavefront and the mismatches; and the
report's text against golden files in tests/fixtures/hang (regenerate with
``UNIRANK_REGEN_GOLDEN=1`` and review the diff)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from unirank.hang.detect import (
    AHEAD,
    ENDED,
    MISMATCH,
    NOT_ENTERED,
    Blame,
    blame,
    blamed,
    cannot_return,
    find_hangs,
    find_uneven,
    verdict,
)
from unirank.hang.render import (
    mismatch_line,
    render_report,
    stack_groups,
    timeout_message,
    uneven_ended,
    uneven_line,
    wavefront_line,
)

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "hang"
NOW = 1000.0


def group(entered: int, done: int, *, op: str = "all_reduce", what: str = "float32[1024]",
          since: float | None = 900.0, site: str = "train.py:57", pg: str = "0",
          ranks: list[int] | None = None) -> dict[str, Any]:
    return {"pg": pg, "entered": entered, "done": done, "op": op, "what": what,
            "since": since, "site": site, "ranks": ranks}


def record(rank: int, *groups: dict[str, Any], node: str = "node1", where: str = "",
           time: float = NOW, finished: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {"rank": rank, "node": node, "time": time, "where": where,
                            "groups": list(groups)}
    if finished:
        data["finished"] = True
    return data


def waiting_world(laggard: dict[str, Any], world: int = 8) -> dict[int, dict[str, Any] | None]:
    records: dict[int, dict[str, Any] | None] = {
        r: record(r, group(1025, 1024), node="node1" if r < 4 else "node2")
        for r in range(world - 1)}
    records[world - 1] = laggard
    return records


def test_a_rank_that_has_not_entered_is_the_wavefront() -> None:
    laggard = record(7, group(1024, 1024, since=800.0), node="node2",
                     where="save_checkpoint (train.py:80)")
    [hang] = find_hangs(waiting_world(laggard), 8, 60.0, NOW + 1)
    assert (hang.pg, hang.seq, hang.waited) == ("0", 1025, 101.0)
    assert [c.ranks for c in hang.waiting] == [tuple(range(7))]
    assert [(lag.rank, lag.last, lag.where) for lag in hang.laggards] == [
        (7, 1024, "save_checkpoint (train.py:80)")]
    assert wavefront_line(hang) == (
        "ranks 0-6 (node1, node2) wait in all_reduce #1025 (float32[1024], train.py:57) since "
        "101 s; rank 7 (node2) has not entered it: its main thread is in save_checkpoint "
        "(train.py:80)")


def test_no_hang_below_the_threshold_nor_when_nobody_waits() -> None:
    laggard = record(7, group(1024, 1024), where="save_checkpoint (train.py:80)")
    assert find_hangs(waiting_world(laggard), 8, 200.0, NOW) == []  # waited 100 s < 200 s
    computing = {r: record(r, group(12, 12)) for r in range(4)}
    assert find_hangs(computing, 4, 0.0, NOW) == []


def test_every_rank_in_the_same_collective_is_no_hang() -> None:
    records: dict[int, dict[str, Any] | None] = {r: record(r, group(5, 4)) for r in range(4)}
    assert find_hangs(records, 4, 60.0, NOW) == []


def test_a_mismatch_at_the_same_number() -> None:
    records: dict[int, dict[str, Any] | None] = {r: record(r, group(12, 11)) for r in range(3)}
    records[3] = record(3, group(12, 11, op="broadcast", site="train.py:60"))
    [hang] = find_hangs(records, 4, 60.0, NOW)
    assert hang.laggards == ()
    assert [(c.ranks, c.op) for c in hang.mismatched] == [((3,), "broadcast")]
    text = render_report([hang], {}, unanswered=[], number=1, report_after=60,
                         nodes={}, answer_timeout=13)
    assert ("  mismatch: rank 3 (node1) called broadcast #12 (float32[1024], train.py:60), "
            "ranks 0-2 (node1) all_reduce #12 (float32[1024], train.py:57)\n") in text


def test_only_a_mismatch_is_collectives_that_cannot_return() -> None:
    """A stop ends early the ranks of a mismatch (:func:`cannot_return`), never those that
    wait for a rank that has not come yet (it may come, and their stop handlers then run)."""
    records: dict[int, dict[str, Any] | None] = {r: record(r, group(12, 11)) for r in range(3)}
    records[3] = record(3, group(12, 11, op="broadcast", site="train.py:60"))
    assert cannot_return(find_hangs(records, 4, 60.0, NOW))
    late: dict[int, dict[str, Any] | None] = {r: record(r, group(12, 11)) for r in range(3)}
    late[3] = record(3, group(11, 11))
    hangs = find_hangs(late, 4, 60.0, NOW)
    assert hangs and blame(hangs[0]).kind == NOT_ENTERED and not cannot_return(hangs)
    assert not cannot_return([])


def test_a_shape_mismatch_names_the_shapes() -> None:
    records: dict[int, dict[str, Any] | None] = {
        r: record(r, group(3, 2, op="all_gather", what=f"float32[{4 + (r == 1)}]"))
        for r in range(2)}
    [hang] = find_hangs(records, 2, 60.0, NOW)
    text = render_report([hang], {}, unanswered=[], number=1, report_after=60,
                         nodes={}, answer_timeout=13)
    assert ("mismatch: rank 1 (node1) called all_gather #3 (float32[5], train.py:57), rank 0 "
            "(node1) all_gather #3 (float32[4], train.py:57)") in text


def test_a_rank_gone_on_to_a_later_collective_is_a_hang_and_the_mismatch_is_named() -> None:
    """Issue 34: gloo hands rank 1 a result for its all_reduce of another shape; it goes on to
    barrier #5 while rank 0 waits in all_reduce #4 for ever."""
    calls = [[n, "all_reduce", "float32[4]", "shape2.py:7"] for n in (1, 2, 3)]
    records: dict[int, dict[str, Any] | None] = {
        0: record(0, {**group(4, 3, what="float32[4]", site="shape2.py:8"),
                      "calls": [*calls, [4, "all_reduce", "float32[4]", "shape2.py:8"]]}),
        1: record(1, {**group(5, 4, op="barrier", what="", site="shape2.py:9"),
                      "calls": [*calls, [4, "all_reduce", "float32[2]", "shape2.py:8"],
                                [5, "barrier", "", "shape2.py:9"]]}, node="node2")}
    [hang] = find_hangs(records, 2, 60.0, NOW)
    assert (hang.seq, hang.laggards, [a.rank for a in hang.ahead]) == (4, (), [1])
    assert blamed(hang) == (1,)
    assert wavefront_line(hang) == (
        "rank 0 (node1) waits in all_reduce #4 (float32[4], shape2.py:8) since 100 s; rank 1 "
        "(node2) has left it: it waits in barrier #5 (shape2.py:9) since 100 s")
    assert mismatch_line(hang) == (
        "rank 1 (node2) called all_reduce #4 (float32[2], shape2.py:8), rank 0 (node1) "
        "all_reduce #4 (float32[4], shape2.py:8)")
    assert find_hangs(records, 2, 101.0, NOW) == []  # not yet


def test_the_earliest_differing_collective_is_the_mismatch() -> None:
    """A rank that skipped a barrier pairs its later calls with the others' next ones: the
    first number whose ops differ is named, not the one they wait at."""
    zero = [[3, "all_reduce", "float32[4]", "a.py:3"], [4, "barrier", "", "a.py:4"],
            [5, "all_reduce", "float32[4]", "a.py:5"]]
    one = [[3, "all_reduce", "float32[4]", "a.py:3"], [4, "all_reduce", "float32[4]", "a.py:5"]]
    records: dict[int, dict[str, Any] | None] = {
        0: record(0, {**group(5, 4, what="float32[4]"), "calls": zero}),
        1: record(1, {**group(4, 4, what="float32[4]", since=990.0), "calls": one},
                  finished=True)}
    [hang] = find_hangs(records, 2, 60.0, NOW)
    assert [(c.ranks, c.op, c.seq, c.site) for c in hang.mismatched] == [
        ((1,), "all_reduce", 4, "a.py:5")]
    assert [(c.ranks, c.op) for c in hang.matched] == [((0,), "barrier")]
    assert wavefront_line(hang).endswith("rank 1 (node1) has not entered it: its program has "
                                         "ended")
    assert blamed(hang) == (1,)


def test_a_rank_that_finished_the_collective_and_computes_is_a_hang() -> None:
    records: dict[int, dict[str, Any] | None] = {
        0: record(0, group(7, 6)),
        1: record(1, group(7, 7), where="evaluate (train.py:90)")}
    [hang] = find_hangs(records, 2, 60.0, NOW)
    assert wavefront_line(hang).endswith(
        "rank 1 (node1) has left it: it is in evaluate (train.py:90) (its last collective: #7)")
    assert blamed(hang) == (1,)


def test_scatter_shapes_may_differ_between_ranks() -> None:
    records: dict[int, dict[str, Any] | None] = {
        r: record(r, group(3, 2, op="scatter", what="float32[4]" if r else "float32[4], "
                           "float32[4]")) for r in range(2)}
    assert find_hangs(records, 2, 60.0, NOW) == []


def test_blame_goes_to_the_ranks_still_running_before_ended_ones() -> None:
    records: dict[int, dict[str, Any] | None] = {0: record(0, group(9, 8)),
                                                 1: record(1, group(8, 8), finished=True),
                                                 2: record(2, group(8, 8), where="f (a.py:1)")}
    [hang] = find_hangs(records, 3, 60.0, NOW)
    assert blamed(hang) == (2,)


def test_silent_and_finished_ranks_are_laggards() -> None:
    records: dict[int, dict[str, Any] | None] = {r: record(r, group(9, 8)) for r in range(2)}
    records[2] = record(2, group(8, 8), finished=True)
    records[3] = None
    [hang] = find_hangs(records, 4, 60.0, NOW)
    assert wavefront_line(hang).endswith(
        "ranks 2-3 (node1) have not entered it: rank 2's program has ended, rank 3 sent no "
        "progress record (not started, or frozen)")


def test_a_subgroup_counts_its_own_ranks_only() -> None:
    sub = [0, 1]
    records: dict[int, dict[str, Any] | None] = {
        0: record(0, group(3, 2, pg="1", ranks=sub)),
        1: record(1, group(2, 2, pg="1", ranks=sub), where="load (data.py:9)"),
        2: record(2), 3: record(3)}
    [hang] = find_hangs(records, 4, 60.0, NOW)
    assert (hang.pg, [lag.rank for lag in hang.laggards]) == ("1", [1])


def test_identical_stacks_are_grouped() -> None:
    waiting = [{"name": "MainThread", "frames": [["train.py", 57, "<module>", "x"]]}]
    saving = [{"name": "MainThread", "frames": [["train.py", 80, "save", "y"]]}]
    groups = stack_groups({0: waiting, 1: waiting, 2: saving, 3: waiting})
    assert [ranks for ranks, _ in groups] == [[0, 1, 3], [2]]


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UNIRANK_REGEN_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with UNIRANK_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"the report changed; if deliberate, regenerate {path}"


@pytest.mark.parametrize("ending", [False, True], ids=["report", "timeout"])
def test_report_golden(ending: bool) -> None:
    laggard = record(7, group(1024, 1024), node="node2", where="save_checkpoint (train.py:80)")
    records = waiting_world(laggard)
    records[5] = record(5, group(1025, 1024, op="broadcast", site="train.py:61"), node="node2")
    hangs = find_hangs(records, 8, 60.0, NOW + 1)
    waiting = [{"name": "MainThread", "frames": [
        ["/work/train.py", 90, "<module>", "train(model)"],
        ["/work/train.py", 57, "train", "dist.all_reduce(grad)"]]},
        {"name": "pin_memory", "frames": [["/work/data.py", 12, "pin", "queue.get()"]]}]
    saving = [{"name": "MainThread", "frames": [
        ["/work/train.py", 90, "<module>", "train(model)"],
        ["/work/train.py", 80, "save_checkpoint", "torch.save(state, path)"]]}]
    stacks = {r: waiting for r in range(5)} | {7: saving}
    nodes = {r: "node1" if r < 4 else "node2" for r in range(8)}
    text = render_report(
        hangs, stacks, unanswered=[5, 6], number=2, report_after=60, nodes=nodes,
        answer_timeout=13, dump_files=["/logs/run/attempt_0/hang/report-2.txt",
                                       "/logs/run/attempt_0/hang/report-2.json"],
        ending="ending the job (--hang-timeout 600 s, exit code 86)" if ending else "")
    _check_golden(f"report_{'timeout' if ending else 'plain'}.txt", text)


def test_report_on_stop_golden() -> None:
    """The report made at a stop (``cause``): its first line says why, not the delay."""
    laggard = record(7, group(1024, 1024), node="node2", where="save_checkpoint (train.py:80)")
    hangs = find_hangs(waiting_world(laggard), 8, 5.0, NOW)
    stacks = {r: [{"name": "MainThread", "frames": [
        ["/work/train.py", 57, "train", "dist.all_reduce(grad)"]]}] for r in range(7)}
    text = render_report(hangs, stacks, unanswered=[7], number=0, report_after=5,
                         nodes={r: "node1" if r < 4 else "node2" for r in range(8)},
                         answer_timeout=7, cause="on SIGINT")
    _check_golden("report_on_stop.txt", text)


def test_snapshot_golden() -> None:
    """``unirank stacks``'s text: ranks with the same progress together, then the stacks."""
    records: dict[int, dict[str, Any] | None] = {
        r: record(r, group(1025, 1024), where="<module> (train.py:90)", node="node1")
        for r in range(3)}
    records[3] = record(3, group(1024, 1024), where="save_checkpoint (train.py:80)",
                        node="node2")
    records[4] = None
    saving = [{"name": "MainThread", "frames": [
        ["/work/train.py", 80, "save_checkpoint", "torch.save(state, path)"]]}]
    waiting = [{"name": "MainThread", "frames": [
        ["/work/train.py", 57, "train", "dist.all_reduce(grad)"]]}]
    from unirank.hang.render import render_snapshot

    text = render_snapshot(records, {0: waiting, 1: waiting, 2: waiting, 3: saving},
                           job="demo", unanswered=[4], nodes={3: "node2", 4: "node2"},
                           now=NOW, answer_timeout=4)
    _check_golden("snapshot.txt", text)


def test_a_peer_that_ended_before_this_ranks_collective_is_uneven() -> None:
    records: dict[int, dict[str, Any] | None] = {
        0: record(0, group(3, 3, what="float32[4]", site="skip1.py:9")),
        1: record(1, group(2, 2), finished=True), 2: record(2, group(3, 3))}
    uneven = find_uneven(records, 0)
    assert uneven is not None and uneven.ended == ((1, 2),)
    assert uneven_line(uneven) == (
        "the ranks ran different numbers of collectives: rank 1 ended its program after "
        "collective #2, rank 0 called all_reduce #3 (float32[4], skip1.py:9)")
    records[1] = record(1, group(3, 3), finished=True)
    assert find_uneven(records, 0) is None  # the same count: not this


def test_the_ranks_that_ended_are_read_back_from_the_uneven_line() -> None:
    """The failure summary reads which ranks ended early from the failing rank's error."""
    line = ("unirank: the ranks ran different numbers of collectives: rank 1 ended its "
            "program after collective #2, rank 3 ended its program after collective #5, "
            "rank 0 called all_reduce #6 (float32[4])")
    assert uneven_ended(line) == {1: 2, 3: 5}
    assert uneven_ended("RuntimeError: Connection closed by peer") == {}


def test_the_timeout_message_keeps_the_mismatch_and_blames_its_rank() -> None:
    records: dict[int, dict[str, Any] | None] = {r: record(r, group(12, 11)) for r in range(3)}
    records[2] = record(2, group(12, 11, op="broadcast", site="train.py:60"), node="node2")
    hangs = find_hangs(records, 3, 60.0, NOW)
    assert blamed(hangs[0]) == (2,)
    assert timeout_message(hangs, 600) == (
        "no progress for 600 s (--hang-timeout): mismatch: rank 2 (node2) called broadcast #12 "
        "(float32[1024], train.py:60), ranks 0-1 (node1) all_reduce #12 (float32[1024], "
        "train.py:57); ranks 0-1 (node1) wait in all_reduce #12 (float32[1024], train.py:57) "
        "since 100 s")


def test_a_later_report_is_short() -> None:
    """The same hang's later reports say which stacks changed, not the stacks (golden)."""
    laggard = record(7, group(1024, 1024), node="node2", where="save_checkpoint (train.py:80)")
    hangs = find_hangs(waiting_world(laggard), 8, 60.0, NOW + 1)
    text = render_report(hangs, {}, unanswered=[6], number=3, report_after=60,
                         nodes={r: "node1" if r < 4 else "node2" for r in range(8)},
                         answer_timeout=13, since=(1, [7]),
                         dump_files=["/logs/run/attempt_0/hang/report-3.txt"])
    _check_golden("report_short.txt", text)


def test_ranks_with_collectives_queued_behind_the_same_one_are_no_hang() -> None:
    """NCCL enqueues ahead: a rank that entered #12 but finished only #10 has not left #11."""
    records: dict[int, dict[str, Any] | None] = {0: record(0, group(11, 10)),
                                                 1: record(1, {**group(12, 10), "calls": [
                                                     [11, "all_reduce", "float32[1024]", ""],
                                                     [12, "all_reduce", "float32[1024]", ""]]})}
    assert find_hangs(records, 2, 60.0, NOW) == []
    records[1] = record(1, group(12, 10))  # #11 not in its record: not taken for a rank ahead
    assert find_hangs(records, 2, 60.0, NOW) == []


def test_one_blame_names_the_report_s_ranks_and_the_eviction_s() -> None:
    """Issue 40: the ranks a hang is blamed on and those ``--on-hang evict`` leaves out come
    from one choice (:func:`blame`): only ranks that never entered the collective while
    their program runs are evicted; a mismatch (every rank waits), ranks whose program ended
    and ranks gone on past the collective leave nothing to evict."""
    stuck = find_hangs(waiting_world(record(7, group(1024, 1024), node="node2")), 8, 60.0, NOW)
    mismatch = {r: record(r, group(12, 11)) for r in range(3)}
    mismatch[3] = record(3, group(12, 11, op="broadcast"))
    shapes = {r: record(r, group(3, 2, what=f"float32[{4 + (r == 1)}]")) for r in range(2)}
    ended = {0: record(0, group(9, 8)), 1: record(1, group(8, 8), finished=True)}
    ahead = {0: record(0, group(7, 6)), 1: record(1, group(7, 7), where="f (a.py:1)")}
    both = {0: record(0, group(9, 8)), 1: record(1, group(9, 8, what="float32[2]")),
            2: record(2, group(8, 8), where="f (a.py:1)")}  # a mismatch and a rank not there
    cases = {"stuck": (stuck[0], (7,), NOT_ENTERED, [7])}
    for name, records, ranks, kind in (("mismatch", mismatch, (3,), MISMATCH),
                                       ("shapes", shapes, (1,), MISMATCH),
                                       ("ended", ended, (1,), ENDED),
                                       ("ahead", ahead, (1,), AHEAD),
                                       ("both", both, (1,), MISMATCH)):
        [hang] = find_hangs(records, len(records), 60.0, NOW)
        cases[name] = (hang, ranks, kind, [])
    for name, (hang, ranks, kind, evicted) in cases.items():
        assert blame(hang) == Blame(ranks, kind), name
        assert blamed(hang) == ranks, name
        found = verdict(hang)
        assert (found["never_entered"], found["blamed"], found["blame"]) == (
            evicted, list(ranks), kind), name
    assert verdict(stuck[0])["call"] == "all_reduce #1025"
