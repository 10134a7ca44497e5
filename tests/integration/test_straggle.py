"""Stragglers on real ``unirank run -n 3`` jobs (gloo): a rank that does ten times the others'
work per step is named as the one that kept the others waiting, in the block at the end and in
``--timeline``'s rows; a balanced run names nobody; on the testbed's two nodes, rank 0's node
prints the block once and names the slow rank of the other node with that node. The runs last
3 s of collectives (rank 0 decides when to stop, and tells the others through the loop's own
all_reduce, so every rank makes the same calls) with the detector's interval at 0.25 s, so that
the block is printed; what is asserted is who is named, never a time."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from _procs import Runner

pytestmark = pytest.mark.integration

LOOP = """import os
import time

import torch
import torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
SLOW = int(os.environ.get("SLOW_RANK", "-1"))


def step(a):
    if os.environ.get("BALANCED"):
        time.sleep(0.01)  # the same wait on every rank (I/O), whatever the core count
        return a
    for _ in range(10 * 20 if rank == SLOW else 20):  # a deterministic amount of work
        a = torch.tanh(a @ a)
    return a


a = torch.randn(96, 96)
stop = torch.zeros(1)
start = time.monotonic()
while True:
    a = step(a)
    stop[0] = float(rank == 0 and time.monotonic() - start > 3.0)
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)
    if stop[0]:
        break
print("steps done", rank)
dist.destroy_process_group()
"""

ENV = {"UNIRANK_HANG_INTERVAL": "0.25"}
NAMED = re.compile(r"^unirank run: rank (\d+) \((\S+)\) kept the others waiting \d+ % of the "
                   r"time$", re.M)


def test_the_rank_with_ten_times_the_work_is_named(runner: Runner, tmp_path: Path) -> None:
    runner.script("loop.py", LOOP)
    raw = tmp_path / "times.json"
    result = runner.run(["-n", "3", "--timeline-json", str(raw), "loop.py"],
                        env={**ENV, "SLOW_RANK": "2"})
    assert result.returncode == 0, result.stderr
    assert [int(rank) for rank, _ in NAMED.findall(result.stderr)] == [2], result.stderr
    block = result.stderr[result.stderr.index("unirank run: time in collectives"):]
    assert [line.split()[1] for line in block.splitlines()[1:4]] == ["0", "1", "2"]
    records = {r["rank"]: r for r in json.loads(raw.read_text())}
    assert all(r["collectives"]["samples"] > 0 and r["watcher"]["ticks"] > 0
               for r in records.values())
    table = result.stderr[result.stderr.index("start-up timeline of 3 ranks"):]
    assert re.search(r"^  in collectives \(%\) .* rank 2 on \S+ \(least\)$", table, re.M)


def test_a_balanced_run_names_nobody(runner: Runner) -> None:
    runner.script("loop.py", LOOP)
    result = runner.run(["-n", "3", "loop.py"], env={**ENV, "BALANCED": "1"})
    assert result.returncode == 0, result.stderr
    assert "unirank run: time in collectives" in result.stderr  # measured, and long enough
    assert NAMED.findall(result.stderr) == [], result.stderr


def test_a_short_run_prints_no_block(runner: Runner) -> None:
    runner.script("hello.py", "import torch.distributed as dist\n"
                              "dist.init_process_group('gloo')\ndist.barrier()\n")
    result = runner.run(["-n", "2", "hello.py"], env=ENV)
    assert result.returncode == 0, result.stderr
    assert "time in collectives" not in result.stderr


def test_two_nodes_one_block_naming_the_other_node_s_rank(slurm_testbed: Any) -> None:
    folder = slurm_testbed.work_dir
    (folder / "straggle_loop.py").write_text(LOOP)
    result = slurm_testbed.srun(
        Runner.command(["-n", "2", str(folder / "straggle_loop.py")],
                       prefix=["-N2", "--ntasks-per-node=1"]),
        timeout=180, env={**ENV, "SLOW_RANK": "3"})
    assert result.stderr.count("unirank run: time in collectives") == 1, result.stderr
    assert NAMED.findall(result.stderr) == [("3", "node2")], result.stderr
