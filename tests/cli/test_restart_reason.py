"""A restarted script learns why (``ur.elastic_state()``), with real processes: under ``unirank
run --max-restarts 1`` a worker failing in attempt 0 is named in attempt 1 (rank, node, exit
code), from a ``Parallel`` script and from a plain one; under torchrun the restart count is
known and the reason is ``unknown``. (The lost and the joined node: tests/cli/test_elastic.py.)

Environment variables read: the caller's environment, from which launcher variables are removed
(see ``tests/_procs.py``).
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from _procs import Runner

pytestmark = pytest.mark.integration

#: every rank says what ur.elastic_state() answers; rank 1 fails with exit code 3 in attempt 0
PARALLEL = """
import sys
import unirank as ur

def body(local_rank):
    state = ur.elastic_state()
    reason = state.reason
    print(f"rank {ur.get_rank()} restart {state.restart_count} of {state.max_restarts} world "
          f"{state.previous_world_size} -> {state.world_size} reason "
          f"{reason and (reason.kind, reason.rank, reason.node, reason.exit_code)}", flush=True)
    if state.restart_count == 0 and ur.get_rank() == 1:
        sys.exit(3)

with ur.Parallel(backend="gloo") as parallel:
    parallel.run(body)
"""

PLAIN = """
import unirank as ur
state = ur.elastic_state()
print(f"rank {ur.get_rank()}: {state.describe()}", flush=True)
if state.restart_count == 0 and ur.get_rank() == 1:
    raise SystemExit(3)
"""


def test_a_restarted_parallel_script_learns_which_worker_failed(runner: Runner) -> None:
    runner.script("train.py", PARALLEL)
    ended = runner.run(["-n", "2", "--max-restarts", "1", "train.py"],
                       env={"UNIRANK_NODE_NAME": "nodeA"})
    assert ended.returncode == 0, ended.stderr
    lines = sorted(line for line in ended.stdout.splitlines() if line.startswith("rank "))
    assert lines == [
        "rank 0 restart 0 of 1 world None -> 2 reason None",
        "rank 0 restart 1 of 1 world 2 -> 2 reason ('worker failed', 1, 'nodeA', 3)",
        "rank 1 restart 0 of 1 world None -> 2 reason None",
        "rank 1 restart 1 of 1 world 2 -> 2 reason ('worker failed', 1, 'nodeA', 3)",
    ], ended.stdout


def test_a_plain_script_s_restart_is_described_in_one_line(runner: Runner) -> None:
    runner.script("plain.py", PLAIN)
    ended = runner.run(["-n", "2", "--max-restarts", "2", "plain.py"],
                       env={"UNIRANK_NODE_NAME": "nodeA"})
    assert ended.returncode == 0, ended.stderr
    assert "rank 0: restart 1 of 2 (worker failed: rank 1 on nodeA (exit code 3)), world " \
           "size 2" in ended.stdout, ended.stdout


def test_under_torchrun_the_count_is_known_and_the_reason_is_not(runner: Runner) -> None:
    torchrun = shutil.which("torchrun")
    assert torchrun, "torchrun comes with torch"
    runner.script("plain.py", PLAIN)
    done = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "--max-restarts",
                           "1", "--monitor-interval", "0.1", "plain.py"], cwd=runner.cwd,
                          env=runner.environ(), capture_output=True, text=True,
                          timeout=runner.timeout, check=False)
    assert done.returncode == 0, done.stderr
    assert "rank 0: restart 1 of 1 (unknown), world size 2" in done.stdout, done.stdout
    assert "rank 1: first attempt, world size 2" in done.stdout, done.stdout
