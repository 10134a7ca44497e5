"""The examples as srun tasks on the two-node testbed: one task per rank.

Each task first prints ``UNIRANK_INFO`` (``scripts/with_info.sh``: the raw SLURM_JOB_ID and
SLURM_STEP_ID, and ``unirank info --json``), then execs the example. The master must be the step's
first node and the port README's formula of the job and step ids Slurm gave.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import SlurmTestbed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _outputs import (
    JOB_ENV,
    PY,
    REPO,
    check_world,
    only,
    parse_hello,
    parse_reduce,
    slurm_port,
    task_infos,
    with_info,
)

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

TIMEOUT = 120.0


def _srun(testbed: SlurmTestbed, options: list[str], example: str) -> tuple[str, list[Any]]:
    result = testbed.srun(
        [*options, f"--chdir={REPO}", *with_info(PY, f"examples/{example}")],
        timeout=TIMEOUT, env=JOB_ENV,
    )
    out = result.stdout + result.stderr
    return out, task_infos(result.stdout)


def _port_of(infos: list[Any]) -> int:
    """README's formula from the ids Slurm gave; unirank info must agree with it."""
    job = only((r["slurm_job_id"] for r in infos), "SLURM_JOB_ID")
    step = only((r["slurm_step_id"] for r in infos), "SLURM_STEP_ID")
    port = slurm_port(job, step)
    assert {r["info"]["master_port"] for r in infos} == {port}, infos
    assert {r["info"]["launcher"] for r in infos} == {"slurm"}, infos
    return port


def test_srun_one_task_helloworld(slurm_testbed: SlurmTestbed) -> None:
    out, infos = _srun(slurm_testbed, ["-N1", "-n1"], "helloworld.py")
    assert len(infos) == 1, out
    node = infos[0]["info"]["node_name"]
    assert node in slurm_testbed.nodes, out
    check_world(parse_hello(out), 1, addr=node, port=_port_of(infos), nodes=[node], context=out)


def test_srun_one_node_four_tasks_reduction(slurm_testbed: SlurmTestbed) -> None:
    out, infos = _srun(slurm_testbed, ["-N1", "--ntasks-per-node=4"], "reduction.py")
    assert [r["info"]["rank"] for r in infos] == [0, 1, 2, 3], out
    assert [r["info"]["local_rank"] for r in infos] == [0, 1, 2, 3], out
    node = only((r["info"]["node_name"] for r in infos), "node")
    assert node in slurm_testbed.nodes, out
    check_world(parse_reduce(out), 4, addr=node, port=_port_of(infos), nodes=[node] * 4,
                reduced=True, context=out)


def test_srun_two_nodes_two_tasks_each_helloworld(slurm_testbed: SlurmTestbed) -> None:
    out, infos = _srun(slurm_testbed, ["-N2", "--ntasks-per-node=2"], "helloworld.py")
    assert [r["info"]["node_rank"] for r in infos] == [0, 0, 1, 1], out
    assert [r["info"]["local_rank"] for r in infos] == [0, 1, 0, 1], out
    check_world(parse_hello(out), 4, addr="node1", port=_port_of(infos),
                nodes=["node1", "node1", "node2", "node2"], context=out)
