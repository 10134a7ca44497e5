"""``--on-slow evict`` and ``replace`` with real nodes: an elastic job of two loopback nodes
(the same command twice, as torchrun's agents), one rank per node; once both step, rank 1 is
put in a cgroup v1 CPU quota of a fifth of a CPU, and every other process of the job in a group
the scheduler favours (full speed while other tests load the machine), so that rank 0 waits
for rank 1 about four fifths of the time. The straggler is named, evicting its node pays
(:mod:`unirank.hang.slowcost`: two nodes, a fifth of the speed), its node is stopped and says
why in one line, and the other node goes on alone at world 1 and finishes. With ``--on-slow
replace`` and a third node waiting to join (a spare), the slow node's place goes to the
spare: the world stays 2. Every assertion reads the job's output (no clock).

Environment variables read: the caller's environment, from which launcher variables are removed
(see ``tests/_procs.py``).
"""

from __future__ import annotations

import os
import select
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from _cpuquota import favoured_group, make_group, move, move_tree, release
from _procs import Runner, free_port, process_tree, wait_listening
from unirank.exitcodes import EVICTED

pytestmark = pytest.mark.integration

TIMEOUT = 120.0
#: a fifth of a CPU, of each period of 100 ms
QUOTA_US = 20000

# Steps of 50 ms of this thread's CPU and one all-reduce: for ever in the first attempt, 5
# steps in the next (and on a spare node: SPARE set); at step 20 each rank of the first
# attempt writes its rank and pid to the FIFO argv[1].
STEPS = """
import os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
step = 0
while (restart == "0" and not os.environ.get("SPARE")) or step < 5:
    begun = time.thread_time()
    while time.thread_time() - begun < 0.05:
        sum(range(1000))
    dist.all_reduce(torch.ones(1))
    step += 1
    if step == 20 and restart == "0" and not os.environ.get("SPARE"):
        with open(sys.argv[1], "w") as fifo:
            fifo.write(f"{rank} {os.getpid()}\\n")
print(f"done rank {rank} world {world} restart {restart}", flush=True)
dist.destroy_process_group()
"""


def _read_pids(reader: int) -> dict[int, int]:
    """Each rank's pid, once both stepped 20 times."""
    text = b""
    while text.count(b"\n") < 2:
        ready, _, _ = select.select([reader], [], [], TIMEOUT)
        assert ready, f"the ranks did not step 20 times within {TIMEOUT:g} s: {text!r}"
        text += os.read(reader, 64)
    return {int(rank): int(pid) for rank, pid in (line.split() for line in text.splitlines())}


def _holding(procs: list[subprocess.Popen[Any]], pid: int) -> int:
    """The index of the node whose process tree holds ``pid``."""
    return next(i for i, proc in enumerate(procs) if pid in process_tree(proc.pid))


@dataclass
class Ended:
    """A node's ``unirank run`` once it ended: its exit code and output."""

    returncode: int
    out: str
    err: str


def _ended(proc: subprocess.Popen[Any]) -> Ended:
    out, err = proc.communicate(timeout=TIMEOUT)
    return Ended(proc.returncode, out, err)


def _slow_job(runner: Runner, tmp_path: Path, on_slow: str, *, spare: bool = False,
              ) -> tuple[Ended, Ended, Ended | None]:
    """Two nodes of ``--nnodes 1:2 --on-slow ON_SLOW`` (and a spare waiting to join, where
    asked); rank 1 cut to a fifth of a CPU once it stepped 20 times: the slow node, the other
    node and the spare, ended."""
    group, favoured = make_group(QUOTA_US), favoured_group()
    runner.script("steps.py", STEPS)
    fifo = tmp_path / "pid.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    keep = os.open(fifo, os.O_WRONLY)
    port = free_port()
    args = ["--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--on-slow", on_slow, "steps.py",
            str(fifo)]
    env = {"UNIRANK_HANG_INTERVAL": "2.5"}  # windows of 2.5 s, as a quiet job's
    pids: dict[int, int] = {}
    try:
        first = runner.start(args, text=True, env=env)
        wait_listening(port, first, TIMEOUT)
        nodes = [first, runner.start(args, text=True, env=env)]
        pids = _read_pids(reader)
        waiting = None
        if spare:
            waiting = runner.start(args, text=True, env={**env, "SPARE": "1"})
            assert waiting.stderr is not None
            runner.read_lines(waiting.stderr, 1, contains="this node waits to join: the job ",
                              timeout=TIMEOUT)
            move_tree(favoured, process_tree(waiting.pid))
        slow = _holding(nodes, pids[1])
        for node in nodes:
            move_tree(favoured, process_tree(node.pid))
        move(group, pids[1])
        other = _ended(nodes[1 - slow])
        took = _ended(waiting) if waiting is not None else None
        return _ended(nodes[slow]), other, took
    finally:
        release(group)
        release(favoured)
        os.close(reader)
        os.close(keep)


def test_a_node_cut_to_a_fifth_of_a_cpu_is_evicted_and_the_other_goes_on(
        runner: Runner, tmp_path: Path) -> None:
    evicted, survivor, _ = _slow_job(runner, tmp_path, "evict")
    assert evicted.returncode == EVICTED, evicted.err
    last = evicted.err.strip().splitlines()[-1]
    assert last.startswith("unirank run: error: node evicted: rank 1 kept the others "
                           "waiting ") and " % of the time HINT: " in last, evicted.err
    assert survivor.returncode == 0, survivor.err + evicted.err
    assert "done rank 0 world 1 restart 1" in survivor.out.splitlines(), survivor.out
    named = survivor.err + evicted.err  # rank 0's node says the straggler, wherever it ran
    assert "unirank: straggler: rank 1 (" in named, named
    assert "attempt 0 stopped (node evicted: rank 1 kept the others waiting " in survivor.err


def test_under_replace_a_spare_takes_the_slow_node_s_place_and_the_world_keeps_its_size(
        runner: Runner, tmp_path: Path) -> None:
    evicted, survivor, spare = _slow_job(runner, tmp_path, "replace", spare=True)
    assert spare is not None
    assert evicted.returncode == EVICTED, evicted.err
    assert (survivor.returncode, spare.returncode) == (0, 0), survivor.err + spare.err
    # the world kept its size: the spare took the slow node's place
    assert "done rank 0 world 2 restart 1" in survivor.out.splitlines(), survivor.out
    assert "done rank 1 world 2 " in spare.out, spare.out
    assert "attempt 0 stopped (node evicted: rank 1 kept the others waiting " in survivor.err
