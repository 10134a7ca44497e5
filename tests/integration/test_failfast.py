"""Mistakes in a multi-node start-up end the whole job within seconds, naming the node at fault,
instead of every other rank waiting out the init timeout.

Every job here runs with a 300 s init timeout and a 60 s subprocess (or srun) timeout, so a job
that waits the timeout out fails the test.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import SlurmTestbed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _outputs import EXAMPLES, REPO, console_script

from _procs import Runner, free_port

LONG_INIT = {"UNIRANK_INIT_TIMEOUT": "300"}
_NOISE = ("Traceback", "frame #", "Exception raised from")
_REFUSAL = ("--node-rank='0': disagrees with the slurm launcher, which gives this node the "
            "rank 1")


@pytest.mark.slurm
@pytest.mark.integration
def test_a_node_refusing_its_layout_ends_the_other_nodes_workers(
    slurm_testbed: SlurmTestbed,
) -> None:
    """``srun -N2 --ntasks-per-node=1 unirank run --node-rank 0 -n 2``: node2 is told node rank
    1 by Slurm and refuses; node1's workers (ranks 0 and 1 of 4) learn it from the store and
    end, naming node2 and its reason."""
    result = slurm_testbed.srun(
        ["-N2", "--ntasks-per-node=1", f"--chdir={REPO}", console_script("unirank"), "run",
         "--node-rank", "0", "-n", "2", str(EXAMPLES / "helloworld.py")],
        timeout=60, env=LONG_INIT, check=False,
    )
    err = result.stderr
    assert result.returncode != 0, err
    refusals = [line for line in err.splitlines() if line.startswith("unirank run: error: ")]
    assert refusals == [f"unirank run: error: {_REFUSAL} HINT: drop node_rank (the launcher's 1 "
                        "is used), or start the job with the layout you meant"], err
    told = re.findall(r"^unirank: rank (\d): the job was stopped before every rank joined: "
                      r"node node2 refused to start its workers: (.*)$", err, re.M)
    assert told and {rank for rank, _ in told} <= {"0", "1"}, err
    assert all(reason.startswith(_REFUSAL) for _, reason in told), err
    assert "hello from" not in result.stdout
    assert not any(noise in err for noise in _NOISE), err


def test_two_nodes_claiming_one_node_rank_are_named(runner: Runner) -> None:
    """Three ``unirank run --nnodes 3`` on this host, two of them with ``--node-rank 1``: the
    second to claim it names both claimants, and every rank ends (node 2 never starts)."""
    port = str(free_port())
    procs = [
        runner.start(["--nnodes", "3", "--node-rank", node_rank, "-n", "1", "--master-addr",
                      "127.0.0.1", "--master-port", port, str(EXAMPLES / "helloworld.py")],
                     env=LONG_INIT, cwd=REPO, text=True)
        for node_rank in ("0", "1", "1")
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=60))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    err = "".join(stderr for _, stderr in outputs)
    assert all(proc.returncode != 0 for proc in procs), err
    pids = {str(proc.pid) for proc in procs[1:]}
    claims = re.findall(r"rank 1 \(node rank 1\) is claimed by two nodes, \S+ \(pid (\d+)\) "
                        r"and \S+ \(pid (\d+)\)\. HINT: give every node a distinct --node-rank",
                        err)
    assert claims and set(claims[0]) == pids, err
    assert "did not join within" not in err, err
    assert not any(noise in err for noise in _NOISE), err
