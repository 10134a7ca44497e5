"""``unirank top``'s rows (pure): rates between two records of a rank, the states, the stuck
mark (the detector's rule at the view's threshold) and the slow mark (the straggler rule over
the window); the window kept per rank; the table for 80 and 40 columns and the JSON object
against golden files in tests/fixtures/top (regenerate with ``UNIRANK_REGEN_GOLDEN=1`` and
review the diff), and docs/top.md's sample."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from unirank.hang.view import (
    ENDED,
    EVICTED,
    MIN_SPAN,
    NONE,
    RESTARTING,
    RUNNING,
    SLOW,
    STUCK,
    STUCK_AFTER,
    WAITING,
    WINDOW,
    History,
    judged_at,
    make_view,
    newest_records,
    restarting,
    stuck_after,
)
from unirank.hang.viewtable import Header, render_view, view_json

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "fixtures" / "top"
T0, T1 = 1000.0, 1005.0


def rec(rank: int, t: float, entered: int, done: int, in_s: float | None, *,
        since: float | None = None, node: str = "", finished: bool = False,
        where: str = "") -> dict[str, Any]:
    node = node or ("nodeA" if rank < 4 else "nodeB")
    return {"rank": rank, "node": node, "time": t, "where": where, "finished": finished,
            "in_s": in_s, "restart": 0,
            "groups": [{"pg": "0", "ranks": None, "entered": entered, "done": done,
                        "op": "all_reduce", "since": since}]}


def world(t: float, count: int, in_s: float, **over: dict[str, Any]) -> dict[int, Any]:
    return {r: rec(r, t, count, count, in_s) for r in range(8)} | {int(k[1:]): v
                                                                    for k, v in over.items()}


def test_rates_are_per_rank_between_its_two_records() -> None:
    old = world(T0, 100, 2.0)
    new = world(T1, 150, 4.5)
    view = make_view(old, new, 8, T1)
    assert {r.per_s for r in view.rows} == {10.0}  # 50 collectives in 5 s
    assert {r.waiting for r in view.rows} == {0.5}  # 2.5 s of 5 in collectives
    assert {r.state for r in view.rows} == {RUNNING}
    assert view.nodes == ("nodeA", "nodeB") and view.marked == {STUCK: [], SLOW: []}


def test_no_rates_from_one_record_and_none_for_a_rank_without_any() -> None:
    new = world(T1, 150, 4.5)
    new[3] = None
    view = make_view({}, new, 8, T1)
    assert view.rows[0].per_s is None and view.rows[0].waiting is None
    assert view.rows[3].state == NONE and view.rows[0].number == 150


def test_the_rank_that_keeps_the_others_waiting_is_slow() -> None:
    old = world(T0, 100, 2.0)
    new = world(T1, 150, 5.0, r5=rec(5, T1, 150, 150, 2.1))  # 0.6 vs 0.02
    view = make_view(old, new, 8, T1)
    assert view.marked == {STUCK: [], SLOW: [5]}
    assert view.notes == ("rank 5 (nodeB) keeps the others waiting: 58 % of the time",)


def test_no_slow_mark_from_a_window_shorter_than_the_minimum() -> None:
    short = T0 + MIN_SPAN / 2
    old = world(T0, 100, 2.0)
    new = world(short, 110, 2.0 + 0.6 * MIN_SPAN / 2, r5=rec(5, short, 110, 110, 2.0))
    assert make_view(old, new, 8, short).marked[SLOW] == []


def stalled(waited: float) -> dict[int, Any]:
    """Ranks 0-6 wait in all_reduce #151 since ``waited`` s; rank 3 still at #150."""
    records = {r: rec(r, T1, 151, 150, 4.0, since=T1 - waited) for r in range(8)}
    records[3] = rec(3, T1, 150, 150, 1.0, where="load (train.py:12)")
    return records


def test_the_rank_the_others_wait_for_is_stuck_after_the_threshold_not_before() -> None:
    before = make_view({}, stalled(STUCK_AFTER - 1), 8, T1)
    assert before.marked[STUCK] == [] and before.rows[0].state == WAITING
    view = make_view(world(T0, 100, 1.0), stalled(STUCK_AFTER), 8, T1)
    assert view.marked == {STUCK: [3], SLOW: []}  # stuck wins; no slow mark in a hang
    assert view.rows[3].number == 150 and view.rows[0].number == 151
    assert view.notes[0].endswith("rank 3 (nodeA) has not entered it: its main thread is in "
                                  "load (train.py:12)")


def test_the_threshold_is_the_detectors_where_shorter() -> None:
    assert stuck_after(None) == STUCK_AFTER and stuck_after(60.0) == STUCK_AFTER
    assert stuck_after(2.0) == 2.0
    assert make_view({}, stalled(2.5), 8, T1, report_after=2.0).marked[STUCK] == [3]


def test_waits_are_judged_at_the_oldest_record_not_stretched() -> None:
    records = stalled(1.0)
    records[3] = rec(3, T1 - 3, 150, 150, 1.0)  # its record is 3 s old
    # judged at now: the others would have waited 1 + 10 s; judged at T1 - 3: none long
    assert judged_at(records, T1 + 10, silent=20) == T1 - 3
    assert make_view({}, records, 8, T1 + 10, silent=20).marked[STUCK] == []
    # a rank silent past ``silent`` no longer holds the clock back
    assert judged_at(records, T1 + 10, silent=12) == T1


def test_ended_and_waiting_states() -> None:
    records = world(T1, 150, 4.0, r2=rec(2, T1, 150, 150, 4.0, finished=True),
                    r4=rec(4, T1, 151, 150, 4.0, since=T1 - 2))
    states = [r.state for r in make_view({}, records, 8, T1).rows]
    assert states[2] == ENDED and states[4] == WAITING and states[0] == RUNNING


def test_history_keeps_about_one_window_of_each_rank() -> None:
    history = History()
    for t in range(0, 20):
        history.add(0, rec(0, T0 + t, t, t, 0.0))
    history.add(0, rec(0, T0 + 5, 5, 5, 0.0))  # older than the newest: ignored
    assert history.newest()[0]["time"] == T0 + 19
    assert history.oldest()[0]["time"] == T0 + 19 - WINDOW
    stale = History()
    stale.add(1, rec(1, T0, 0, 0, 0.0))
    stale.add(1, rec(1, T0 + 600, 9, 9, 0.0))  # a live record left by a view long ago
    assert stale.oldest() == {}


def test_the_newer_of_a_ranks_live_and_progress_records_counts() -> None:
    live = {0: rec(0, T0, 1, 1, 0.0), 1: rec(1, T1, 9, 9, 0.0), 2: None}
    progress = {0: rec(0, T1, 5, 5, 0.0), 1: rec(1, T0, 1, 1, 0.0), 2: rec(2, T0, 1, 1, 0.0)}
    found = newest_records(live, progress)
    assert [found[r]["groups"][0]["entered"] for r in range(3)] == [5, 9, 1]  # type: ignore


HEADER = Header("demo", 8, "nodeA:29500", 1.0, STUCK_AFTER)


def samples() -> dict[str, tuple[dict[int, Any], dict[int, Any]]]:
    slow = world(T1, 150, 5.0, r5=rec(5, T1, 150, 150, 2.1))
    return {"slow": (world(T0, 100, 2.0), slow),
            "stuck": (world(T0, 100, 1.0), stalled(7.0))}


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UNIRANK_REGEN_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with UNIRANK_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"the view changed; if deliberate, regenerate {path}"


@pytest.mark.parametrize("width", [80, 40])
@pytest.mark.parametrize("case", ["slow", "stuck"])
def test_table_golden(case: str, width: int) -> None:
    old, new = samples()[case]
    lines = render_view(make_view(old, new, 8, T1), HEADER, width)
    assert all(len(line) <= width for line in lines)
    assert sum(1 for line in lines if re.match(r"! +\d", line)) == 1  # the marked row
    _check_golden(f"{case}_{width}.txt", "\n".join(lines) + "\n")


def test_json_golden() -> None:
    old, new = samples()["stuck"]
    data = view_json(make_view(old, new, 8, T1), HEADER, T1)
    assert data["stuck"] == [3] and len(data["ranks"]) == 8
    _check_golden("stuck.json", json.dumps(data, indent=1) + "\n")


def test_docs_sample_is_the_golden_table() -> None:
    page = (ROOT / "docs" / "top.md").read_text()
    blocks = re.findall(r"```\n(unirank top: .*?)```", page, re.S)
    assert blocks, "docs/top.md shows no table"
    goldens = {(GOLDEN / f"{c}_{w}.txt").read_text() for c in ("slow", "stuck") for w in (80, 40)}
    assert all(block in goldens for block in blocks)


def test_no_rate_from_a_record_made_before_the_first_collective() -> None:
    old = {0: {"rank": 0, "node": "n", "time": T0, "groups": [], "in_s": None}}
    assert make_view(old, {0: rec(0, T1, 50, 50, 1.0)}, 1, T1).rows[0].per_s is None


def test_a_short_terminal_keeps_the_marked_rank_and_the_notes() -> None:
    old, new = samples()["stuck"]
    lines = render_view(make_view(old, new, 8, T1), HEADER, 80, height=10)
    assert len(lines) <= 10, lines
    assert any(re.match(r"! +3 .*STUCK", line) for line in lines)
    assert lines[-2].startswith("! ranks 0-2, 4-7") and "more ranks (--json: all)" in lines[-3]
    full = render_view(make_view(old, new, 8, T1), HEADER, 80, height=40)
    assert full == render_view(make_view(old, new, 8, T1), HEADER, 80)


def test_the_docs_state_the_rules_numbers() -> None:
    from unirank.hang.live import LIVE_PERIOD
    from unirank.hang.straggle import STRAGGLER_MARGIN
    from unirank.hang.timings import SILENT
    from unirank.hang.waits import MARK_AFTER

    page = " ".join((ROOT / "docs" / "top.md").read_text().split())
    for sentence in (f"waited in a collective for {STUCK_AFTER:g} s",
                     f"over the last {WINDOW:g} s (at least {MIN_SPAN:g} s)",
                     f"by more than {100 * STRAGGLER_MARGIN:.0f} points",
                     f"in one collective for {MARK_AFTER:g} s or more",
                     f"silent for {SILENT.words()}",
                     f"every {'second' if LIVE_PERIOD == 1 else f'{LIVE_PERIOD:g} s'}"):
        assert sentence in page, sentence


def test_the_header_says_how_many_spares_wait_where_some_do() -> None:
    """The spares a node's ``unirank run`` keeps count of (:func:`unirank.cli.top._spares`):
    said in the header's second line, and in ``--json`` (null where not known)."""
    from dataclasses import replace

    old, new = samples()["slow"]
    view = make_view(old, new, 8, T1)
    with_spares = render_view(view, replace(HEADER, spares=2), 80)
    assert with_spares[1].endswith("; 2 spare nodes waiting"), with_spares
    assert "spare" not in "\n".join(render_view(view, replace(HEADER, spares=0), 80))
    assert view_json(view, replace(HEADER, spares=1), T1)["spares"] == 1
    assert view_json(view, HEADER, T1)["spares"] is None


def test_each_spare_node_has_a_line_with_no_rank_after_the_ranks() -> None:
    """The spares' names the run's spares file keeps (:func:`unirank.runfolder.
    read_spare_nodes`): one line each, rank ``-``, state ``spare``, after the ranks' (kept
    where the height leaves room for few ranks); ``spare_nodes`` in ``--json``."""
    from dataclasses import replace

    old, new = samples()["slow"]
    view = make_view(old, new, 8, T1)
    header = replace(HEADER, spares=2, spare_nodes=("nodeC (10.0.0.3)", ""))
    lines = render_view(view, header, 80)
    spares = [i for i, line in enumerate(lines) if line.split()[:1] == ["-"]]
    assert [lines[i].split() for i in spares] == [
        ["-", "nodeC", "(10.0.0.3)", "spare", "-", "-", "-", "-"],
        ["-", "-", "spare", "-", "-", "-", "-"]], lines
    last_rank = max(i for i, line in enumerate(lines) if line.split()[:1] == ["7"])
    assert min(spares) > last_rank, lines
    short = render_view(view, header, 80, height=8)
    assert sum(line.split()[:1] == ["-"] for line in short) == 2, short
    assert view_json(view, header, T1)["spare_nodes"] == ["nodeC (10.0.0.3)", ""]


def test_between_two_attempts_every_rank_is_restarting_with_no_rates_or_marks() -> None:
    old = world(T0, 100, 0.0)
    new = world(T1, 150, 3.0, r5=rec(5, T1, 150, 150, 0.1))
    view = make_view(old, new, 8, T1)
    assert view.marked[SLOW] == [5]
    between = restarting(view)
    assert {r.state for r in between.rows} == {RESTARTING}
    assert all(r.per_s is None and r.waiting is None for r in between.rows)
    assert [(r.node, r.number, r.restarts) for r in between.rows] == \
        [(r.node, r.number, r.restarts) for r in view.rows]
    assert between.marked == {STUCK: [], SLOW: []} and between.nodes == view.nodes
    shown = view_json(between, Header("job7", 8, "nodeA:29500", 1.0, STUCK_AFTER), T1)
    assert [r["state"] for r in shown["ranks"]] == [RESTARTING] * 8
    assert shown["notes"] == ["the job's store stopped answering: waiting for its next attempt"]


def test_between_two_attempts_the_ranks_of_an_evicted_node_are_evicted_and_the_note_says_why(
        ) -> None:
    view = make_view(world(T0, 100, 0.0), world(T1, 150, 3.0), 8, T1)
    why = "node evicted: rank 5 never entered all_reduce #150"
    between = restarting(view, ([4, 5, 6, 7], why))
    assert [r.state for r in between.rows] == [RESTARTING] * 4 + [EVICTED] * 4
    assert between.notes[0] == why
    shown = view_json(between, Header("job7", 8, "nodeA:29500", 1.0, STUCK_AFTER), T1)
    assert [r["state"] for r in shown["ranks"]][4:] == [EVICTED] * 4
    assert "evicted" in "\n".join(render_view(between, HEADER, 80))
    assert restarting(view, ((), "")).notes == restarting(view).notes  # nothing evicted


def test_a_slow_link_is_said_first_under_the_table_and_in_json() -> None:
    """The node whose link the rendezvous names slow (:func:`unirank.cli.top._slow_link`)."""
    from dataclasses import replace

    old, new = samples()["slow"]
    view = make_view(old, new, 8, T1)
    lines = render_view(view, replace(HEADER, slow_link="vm (10.0.0.3)"), 200)
    plain = render_view(view, HEADER, 200)
    at = len(plain) - len(view.notes)  # the first note's line (200 columns: one line each)
    assert lines[at].startswith("! slow link: node vm (10.0.0.3) (its link is slow"), lines
    assert lines[:at] + lines[at + 1:] == plain, lines
    assert view_json(view, replace(HEADER, slow_link="vm (10.0.0.3)"), T1)["slow_link"] == \
        "vm (10.0.0.3)"
    assert view_json(view, HEADER, T1)["slow_link"] is None
