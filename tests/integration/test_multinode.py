"""One launcher per node on the two-node testbed: ``srun --ntasks-per-node=1`` starting
``unirank run``, ``torchrun`` (static and c10d rendezvous) or a script that spawns one worker per
(fake) GPU with ``Parallel(nproc_per_node=2)``. Every case forms one world of 4 over node1/node2.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import SlurmTestbed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _outputs import (
    JOB_ENV,
    PY,
    REPO,
    SCRIPTS,
    check_world,
    console_script,
    only,
    parse_hello,
    slurm_port,
    tagged_json,
    task_infos,
    with_info,
)

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

TIMEOUT = 120.0
ONE_PER_NODE = ["-N2", "--ntasks-per-node=1", f"--chdir={REPO}"]
BY_RANK = ["node1", "node1", "node2", "node2"]


def test_srun_one_unirank_run_per_node(slurm_testbed: SlurmTestbed) -> None:
    result = slurm_testbed.srun(
        [*ONE_PER_NODE, *with_info(console_script("unirank"), "run", "--nproc-per-node", "2",
                                   "examples/helloworld.py")],
        timeout=TIMEOUT, env=JOB_ENV,
    )
    out = result.stdout + result.stderr
    infos = task_infos(result.stdout)
    assert [(r["info"]["node_rank"], r["info"]["node_name"]) for r in infos] == \
        [(0, "node1"), (1, "node2")], out
    port = slurm_port(only((r["slurm_job_id"] for r in infos), "job"),
                      only((r["slurm_step_id"] for r in infos), "step"))
    check_world(parse_hello(result.stdout), 4, addr="node1", port=port, nodes=BY_RANK,
                context=out)


def _torchrun_per_node(testbed: SlurmTestbed, mode: str) -> tuple[str, list[dict[str, object]]]:
    result = testbed.srun(
        [*ONE_PER_NODE, str(SCRIPTS / "torchrun_node.sh"), mode, console_script("unirank"),
         console_script("torchrun"), "2", "examples/helloworld.py", "--backend", "gloo"],
        timeout=TIMEOUT, env=JOB_ENV,
    )
    nodes = sorted(tagged_json(result.stdout, "TORCHRUN_NODE"), key=lambda r: int(r["node_id"]))
    return result.stdout + result.stderr, nodes


def test_torchrun_per_node_static_rendezvous_with_unirank_master(
    slurm_testbed: SlurmTestbed,
) -> None:
    """``torchrun --nnodes 2 --node_rank $SLURM_NODEID --master_addr/--master_port`` from
    ``unirank info``: torchrun's ranks, node ranks and master are what the examples print."""
    out, nodes = _torchrun_per_node(slurm_testbed, "static")
    assert [n["node"] for n in nodes] == ["node1", "node2"], out
    addr = only((n["master_addr"] for n in nodes), "master address")
    port = only((n["master_port"] for n in nodes), "master port")
    assert addr == "node1", out
    assert port == slurm_port(only((n["job_id"] for n in nodes), "job"),
                              only((n["step_id"] for n in nodes), "step")), out
    check_world(parse_hello(out), 4, addr="node1", port=port, nodes=BY_RANK, context=out)


def test_torchrun_per_node_c10d_rendezvous(slurm_testbed: SlurmTestbed) -> None:
    """c10d rendezvous at the unirank-derived endpoint node1:PORT. torch assigns node ranks in
    the order the agents join, so either node may hold ranks 0-1; each node holds two
    consecutive ranks. The master the examples print is the one torchrun's c10d chose."""
    out, nodes = _torchrun_per_node(slurm_testbed, "c10d")
    assert [n["node"] for n in nodes] == ["node1", "node2"], out
    by_rank = check_world(parse_hello(out), 4, context=out)
    ranks_on: dict[str, list[int]] = defaultdict(list)
    for rank, line in sorted(by_rank.items()):
        ranks_on[line.node].append(rank)
    assert sorted(ranks_on.values()) == [[0, 1], [2, 3]], f"{dict(ranks_on)}\n{out}"
    assert set(ranks_on) == {"node1", "node2"}, out


def test_one_task_per_node_spawns_one_worker_per_gpu(slurm_testbed: SlurmTestbed) -> None:
    """``srun -N2 --ntasks-per-node=1 --gres=gpu:2`` and ``Parallel(nproc_per_node=2)`` in the
    script: the srun ranks become node ranks. The GPUs are fake (no CUDA), so the workers use
    gloo; the device each would take is checked as unirank's pure choice from
    CUDA_VISIBLE_DEVICES (``planned_device``)."""
    result = slurm_testbed.srun(
        [*ONE_PER_NODE, "--gres=gpu:2", *with_info(PY, str(SCRIPTS / "per_gpu_workers.py"))],
        timeout=TIMEOUT, env=JOB_ENV,
    )
    out = result.stdout + result.stderr
    workers = sorted(tagged_json(result.stdout, "WORKER"), key=lambda r: int(r["rank"]))
    assert [w["rank"] for w in workers] == [0, 1, 2, 3], out
    assert {w["world"] for w in workers} == {4}, out
    assert [w["node"] for w in workers] == BY_RANK, out
    assert [w["node_rank"] for w in workers] == [0, 0, 1, 1], out
    assert [w["local_rank"] for w in workers] == [0, 1, 0, 1], out
    infos = task_infos(result.stdout)
    port = slurm_port(only((r["slurm_job_id"] for r in infos), "job"),
                      only((r["slurm_step_id"] for r in infos), "step"))
    assert {(w["master_addr"], w["master_port"]) for w in workers} == {("node1", port)}, out
    assert {w["sum"] for w in workers} == {4.0}, out
    assert {w["cuda_visible_devices"] for w in workers} == {"0,1"}, out
    assert [w["planned_device"] for w in workers] == ["cuda:0", "cuda:1"] * 2, out
