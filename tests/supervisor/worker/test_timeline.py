"""``unirank run --timeline``: the table (pure) and real runs, on one node and across the
testbed's two nodes (where rank 0's node prints the whole job's table)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from _procs import Runner
from unirank.supervisor.worker.timeline import PHASES, format_table

sys.path.insert(0, str(Path(__file__).parents[2] / "cli"))
from test_run import TORCHRUN_SCRIPT


def _record(rank: int, node: str, **times: float) -> dict[str, Any]:
    return {"rank": rank, "node": node, "times": times}


def test_table_rows_are_phases_with_min_median_max_and_the_slowest_rank() -> None:
    records = [
        _record(0, "a", started=100.0, bootstrap=100.1, torch=101.0, joined=103.0),
        _record(1, "a", started=100.0, bootstrap=100.2, torch=101.5, joined=103.0),
        _record(2, "b", started=100.5, bootstrap=100.6, torch=102.9, joined=103.0),
    ]
    lines = format_table(records).splitlines()
    assert lines[0] == ("unirank run: start-up timeline of 3 ranks, seconds after the first "
                        "worker started")
    rows = {line[2:29].strip(): line[29:].split() for line in lines[2:]}
    # workers started as their own interpreters: no fork server rows
    assert list(rows) == [label for key, label in PHASES if not key.startswith("preload")]
    assert rows["torch imported"] == ["1.000", "1.500", "2.900", "rank", "2", "on", "b"]
    assert rows["worker process started"][:3] == ["0.000", "0.000", "0.500"]
    assert rows["process group initialised"] == ["-", "-", "-", "(not", "seen)"]


def test_table_names_ranks_that_never_reached_a_phase() -> None:
    records = [_record(0, "a", started=1.0, joined=2.0), _record(1, "a", started=1.0)]
    text = format_table(records)
    assert "rank 0 on a (1 rank never reached it)" in text
    assert format_table([]) == "unirank run: timeline: no rank reported its times\n"


def test_table_has_the_time_in_collectives_as_rows_where_measured() -> None:
    records = [_record(0, "a", started=1.0, joined=2.0), _record(1, "b", started=1.0)]
    assert "in collectives" not in format_table(records)  # the hang watcher was off
    for record, in_s in zip(records, (9.0, 1.0)):
        record["collectives"] = {"in_s": in_s, "wall_s": 10.0, "samples": 500,
                                 "interval": 5.0}
    rows = {line[2:29].strip(): line[29:].split() for line in format_table(records).splitlines()}
    assert rows["in collectives (s)"] == ["1.000", "5.000", "9.000", "rank", "1", "on", "b",
                                          "(least)"]
    assert rows["in collectives (%)"][:3] == ["10.000", "50.000", "90.000"]


@pytest.mark.integration
def test_timeline_of_a_local_run(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(TORCHRUN_SCRIPT)
    raw = tmp_path / "times.json"
    result = runner.run(["-n", "3", "--timeline-json", str(raw), "job.py"])
    assert result.returncode == 0, result.stderr
    records = json.loads(raw.read_text())
    assert sorted(r["rank"] for r in records) == [0, 1, 2]
    order = [key for key, _ in PHASES]
    for record in records:
        assert list(record["times"]) == order  # every phase seen, and in order
        stamps = [record["times"][key] for key in order]
        assert stamps == sorted(stamps)
    table = result.stderr[result.stderr.index("unirank run: start-up timeline of 3 ranks"):]
    for _, label in PHASES:
        assert label in table
    assert "(not seen)" not in table
    assert "seconds after the first fork server started" in table


@pytest.mark.integration
def test_timeline_without_the_fork_server(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(TORCHRUN_SCRIPT)
    raw = tmp_path / "times.json"
    result = runner.run(["-n", "2", "--no-preload", "--timeline-json", str(raw), "job.py"])
    assert result.returncode == 0, result.stderr
    order = [key for key, _ in PHASES if not key.startswith("preload")]
    assert [list(r["times"]) for r in json.loads(raw.read_text())] == [order, order]
    assert "fork server" not in result.stderr


@pytest.mark.integration
def test_no_timeline_no_trace(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "env.py").write_text(
        "import os\nprint(sorted(k for k in os.environ if 'TIMELINE' in k))\n")
    result = runner.run(["-n", "2", "env.py"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[]", "[]"]
    assert "timeline" not in result.stderr


@pytest.mark.integration
def test_two_nodes_one_table_on_rank_0_s_node(slurm_testbed: Any) -> None:
    folder = slurm_testbed.work_dir
    (folder / "tl_job.py").write_text(TORCHRUN_SCRIPT)
    raw = folder / "tl_times.json"
    result = slurm_testbed.srun(
        Runner.command(["-n", "2", "--timeline-json", str(raw), str(folder / "tl_job.py")],
                       prefix=["-N2", "--ntasks-per-node=1"]), timeout=180)
    records = json.loads(raw.read_text())
    assert sorted((r["rank"], r["node"]) for r in records) == [
        (0, "node1"), (1, "node1"), (2, "node2"), (3, "node2")]
    assert all(len(r["times"]) == len(PHASES) for r in records)
    assert result.stderr.count("start-up timeline of 4 ranks") == 1
