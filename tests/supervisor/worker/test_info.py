"""Which node runs rank r, as a worker answers it: from the plan's placement, passed in the
worker's environment (UNIRANK_RANKS_PER_NODE), through the plan's one function
:func:`unirank.supervisor.plan.node_index_of`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unirank.launchers import detect
from unirank.supervisor.plan import LaunchRequest, make_plan, node_index_of
from unirank.supervisor.worker.info import WorkerInfo, read_worker_info
from unirank.supervisor.workerenv import worker_environ

RECORDED = Path(__file__).resolve().parents[2] / "fixtures" / "envs"
#: what ``unirank run`` asks for without options
RUN = LaunchRequest()


def worker_info(recorded: str, request: LaunchRequest = RUN) -> list[WorkerInfo]:
    """What each worker of ``unirank run`` reads, started in the recorded environment."""
    environ = json.loads((RECORDED / recorded).read_text())
    plan = make_plan(request, detect(environ, argv=["unirank"], hostname="host"), environ,
                     run_id_fallback="rid").with_port(29400)
    return [read_worker_info(worker_environ(plan, worker, environ)) for worker in plan.workers]


@pytest.mark.parametrize("task", [0, 1, 2])
def test_srun_placing_two_and_one_tasks(task: int) -> None:
    """``srun -N2 -n3 unirank run``: SLURM_STEP_TASKS_PER_NODE=2,1 puts ranks 0-1 on node1 and
    rank 2 on node2; every worker, node2's included, says so."""
    (info,) = worker_info(f"srun_N2_n3_rank{task}.json")
    assert info.rank == task
    assert [info.node_of(rank) for rank in range(3)] == ["node1", "node1", "node2"]
    assert info.store_node == "node1"


def test_workers_started_per_node_name_every_rank_s_node() -> None:
    """``srun -N2 --ntasks-per-node=1 unirank run -n 2``, on node2: ranks 0-1 on node1."""
    infos = worker_info("srun_N2_npn1_rank1.json", LaunchRequest(nproc_per_node=2))
    assert [info.rank for info in infos] == [2, 3]
    for info in infos:
        assert [info.node_of(rank) for rank in range(4)] == ["node1", "node1", "node2", "node2"]
        assert info.node_of(4) is None  # outside the world


def test_node_index_of_fills_nodes_in_order() -> None:
    assert [node_index_of(rank, (2, 1)) for rank in range(4)] == [0, 0, 1, None]
    assert [node_index_of(rank, (1, 3, 2)) for rank in (0, 1, 3, 4, 5)] == [0, 1, 1, 2, 2]
    assert node_index_of(0, ()) is None and node_index_of(-1, (4,)) is None
