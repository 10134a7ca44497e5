"""A stuck rank in an elastic job with no hang option (the learned hang timeout,
``unirank.hang.learned``): two ``unirank run --nnodes 1:2`` nodes on one host, real workers.
A rank asleep in user code, stopped (SIGSTOP) or in uninterruptible sleep is evicted and the
other node steps on alone; ranks that are slow on purpose (a first step's compile, a
checkpoint in a phase, rank 0 evaluating while the others wait at a barrier, one slow step)
are not. Every assertion reads the nodes' output (no clock).

Environment variables read: the caller's environment, from which launcher variables are removed
(see ``tests/_procs.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from _procs import Runner, free_port, wait_listening
from unirank.exitcodes import EVICTED
from unirank.hang.learned import FLOOR, WARMUP

pytestmark = pytest.mark.integration

TIMEOUT = 120.0
#: the step before which node B's rank gets stuck: past the first step's collectives
STUCK_AT = WARMUP + 4

# Steps of training: each rank all-reduces a one and says the world it sees; with HOW set
# (node B only) its rank gets stuck before step STUCK_AT: asleep, stopped, or in D state (the
# parent of a vfork'ed child that has not exec'ed); with GATE set, its first step waits for that
# file (a first step may take long: no timeout counts it).
STEPS = """
import ctypes, os, signal, sys, time
import torch
import torch.distributed as dist

steps, stuck_at = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
how, gate = os.environ.get("HOW"), os.environ.get("GATE")
for step in range(steps):
    while step == 0 and gate and not os.path.exists(gate):
        time.sleep(0.01)
    if how and step == stuck_at:
        print(f"stuck {how} rank {rank}", flush=True)
        if how == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif how == "dstate":
            libc = ctypes.CDLL(None)
            if libc.vfork() == 0:
                libc.sleep(100)
                libc._exit(0)
        time.sleep(1e9)
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"step {step} rank {rank} world {world} restart {restart}", flush=True)
    time.sleep(0.1)
dist.destroy_process_group()
"""

ARGS = ["--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "3",
        "--rdzv-backend", "c10d"]


def _nodes(runner: Runner, tmp_path: Path, script: str, argv: list[str],
           env_a: dict[str, str] | None = None, env_b: dict[str, str] | None = None,
           options: tuple[str, ...] = ()) -> tuple[subprocess.Popen[Any], subprocess.Popen[Any]]:
    """Node A (serves the rendezvous), then node B once A listens: the same command."""
    (tmp_path / "steps.py").write_text(script)
    port = free_port()
    args = [*ARGS, *options, "--rdzv-endpoint", f"127.0.0.1:{port}", "steps.py", *argv]
    first = runner.start(args, text=True, drop=("OMP_NUM_THREADS",), env=env_a)
    wait_listening(port, first, TIMEOUT)
    second = runner.start(args, text=True, drop=("OMP_NUM_THREADS",), env=env_b)
    return first, second


def _steps(out: str, world: int, restart: int) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("step ")
            and line.endswith(f" world {world} restart {restart}")]


@pytest.mark.parametrize(("how", "rank"), [("sleep", 1), ("stop", 1), ("dstate", 1),
                                           ("sleep", 0)])
def test_a_stuck_rank_is_evicted_with_no_hang_option(runner: Runner, tmp_path: Path,
                                                     how: str, rank: int) -> None:
    """A rank asleep in user code, SIGSTOPped, or in D state before step :data:`STUCK_AT`
    (node B's rank 1; or rank 0 asleep, on node A that serves the rendezvous and runs the
    detector): no ``--hang-timeout`` given, the learned one evicts its node and the other
    node steps on alone to the end. Where node B's rank 1 sleeps, ``unirank top --json`` on
    node A (a temporary folder of its own: one job file of the run there) shows that rank
    ``evicted`` and the other ``restarting`` between the two attempts (the rank's first step
    waits until the view is attached)."""
    steps = STUCK_AT + 30
    stuck = {"HOW": how}
    watched = how == "sleep" and rank == 1
    env_a: dict[str, str] = {}
    run_id = f"evict-{os.getpid()}"
    if watched:
        env_a["TMPDIR"] = str(tmp_path / "a")
        stuck.update(TMPDIR=str(tmp_path / "b"), GATE=str(tmp_path / "gate"))
        os.mkdir(env_a["TMPDIR"])
        os.mkdir(stuck["TMPDIR"])
    first, second = _nodes(runner, tmp_path, STEPS, [str(steps), str(STUCK_AT)],
                           *((env_a, stuck) if rank == 1 else (stuck, None)),
                           options=("--rdzv-id", run_id) if watched else ())
    evicted, survivor = (second, first) if rank == 1 else (first, second)
    if watched:
        states = _top_states(runner, run_id, env_a, Path(stuck["GATE"]), survivor)
        assert states[1][-1] == "evicted" and "restarting" not in states[1], states
        assert states[0][-1] == "restarting" and "evicted" not in states[0], states
    out, err = survivor.communicate(timeout=TIMEOUT)
    out_b, err_b = evicted.communicate(timeout=TIMEOUT)
    assert f"stuck {how} rank {rank}" in out_b, out_b + err_b
    assert survivor.returncode == 0, err + err_b
    assert evicted.returncode == EVICTED, err_b
    why = "published nothing for" if how == "stop" else "used no CPU for"
    report = err if rank == 1 else err_b  # rank 0's node prints it
    assert f"ending the job (rank {rank} {why} " in report, report
    assert f"; the learned hang timeout, {FLOOR:g} s; exit code 86)" in report, report
    assert "unirank: HANG (a stuck rank): ranks have waited in a collective for " in report, \
        report
    assert f"node evicted: rank {rank} never entered all_reduce #{STUCK_AT + 1}" in err, err
    assert len(_steps(out, 2, 0)) == STUCK_AT, out  # the world of 2 up to the stuck step
    assert f"step {steps - 1} rank 0 world 1 restart 1" in out.splitlines(), out


def _top_states(runner: Runner, run_id: str, env: dict[str, str], gate: Path,
                job: subprocess.Popen[Any]) -> dict[int, list[str]]:
    """``unirank top --json`` on the job's node of ``env``: each rank's states in the order
    seen (repeats dropped) until rank 1 is evicted and rank 0 restarting; ``gate`` made once
    the view showed the job."""
    command = [sys.executable, "-m", "unirank", "top", "--job", run_id, "--json"]
    while True:  # until its first rank's watcher wrote the job file
        done = subprocess.run([*command, "--count", "1"], cwd=runner.cwd, capture_output=True,
                              env=runner.environ(env), text=True, timeout=60)
        if done.returncode == 0:
            break
        assert "no running unirank job" in done.stderr and job.poll() is None, done.stderr
    top = subprocess.Popen(command, cwd=runner.cwd, env=runner.environ(env), text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    states: dict[int, list[str]] = {0: [], 1: []}
    try:
        assert top.stdout is not None
        for line in top.stdout:  # bounded by the test's timeout
            for row in json.loads(line)["ranks"]:
                seen = states.setdefault(row["rank"], [])
                if not seen or seen[-1] != row["state"]:
                    seen.append(row["state"])
            gate.touch()
            if "evicted" in states[1] and states[0][-1:] == ["restarting"]:
                break
    finally:
        top.kill()
        top.communicate()
    return states


# The false positives, each 2x the learned timeout's floor (the slow step: 5 steps' time):
# ``compile``: rank 1 asleep before its first collective (the first step's compile);
# ``checkpoint``: every rank saves inside ur.phase, rank 0 for long, rank 1 then waits;
# ``eval``: rank 0 evaluates (its CPU busy) while rank 1 waits at a barrier;
# ``slow``: one step of rank 1 5x slower.
SLOW = """
import os, sys, time
import torch
import torch.distributed as dist
import unirank as ur

steps, hold, cases = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3].split(",")
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]


def busy(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(1000))


for step in range(steps):
    if step == 0 and rank == 1 and "compile" in cases:
        time.sleep(hold)
    if step == 12 and "checkpoint" in cases:
        with ur.phase("checkpoint"):
            time.sleep(hold if rank == 0 else 0.5)
    if step == 16 and "eval" in cases:
        if rank == 0:
            busy(hold)
        dist.barrier()
    if step == 20 and rank == 1 and "slow" in cases:
        time.sleep(0.5)
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"step {step} rank {rank} world {world} restart {restart}", flush=True)
    time.sleep(0.1)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("cases", ["compile,slow", "checkpoint,eval"])
def test_ranks_slow_on_purpose_are_not_evicted(runner: Runner, tmp_path: Path,
                                               cases: str) -> None:
    """No eviction, no ending: both nodes finish at the world of 2, never restarted."""
    steps = 24
    first, second = _nodes(runner, tmp_path, SLOW, [str(steps), f"{2 * FLOOR:g}", cases])
    out, err = first.communicate(timeout=TIMEOUT)
    out_b, err_b = second.communicate(timeout=TIMEOUT)
    assert (first.returncode, second.returncode) == (0, 0), err + err_b
    assert "ending the job" not in err + err_b, err + err_b
    assert len(_steps(out, 2, 0)) == steps, out
    assert len(_steps(out_b, 2, 0)) == steps, out_b
