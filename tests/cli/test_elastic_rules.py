"""The pure rules of the dynamic rendezvous under srun: which runs take it (``cli.elastic.wanted``)
and which node serves the endpoint (``cli.elastic._serves_endpoint``), with DistEnvs built as
detection builds them from recorded Slurm variables."""

from __future__ import annotations

import argparse

import pytest

from unirank.cli.elastic import _serves_endpoint, wanted
from unirank.launchers import detect
from unirank.resolve import same_address

STEP = {"SLURM_JOB_ID": "50", "SLURM_STEP_ID": "0", "SLURM_LOCALID": "0",
        "SLURM_JOB_NODELIST": "node[1-2]"}


def _step(nodes: int, tasks_per_node: int, node: int = 0) -> dict[str, str]:
    """An srun step's variables for the task of local id 0 on node ``node``."""
    names = ",".join(f"node{i + 1}" for i in range(nodes))
    return {**STEP, "SLURM_PROCID": str(node * tasks_per_node),
            "SLURM_NTASKS": str(nodes * tasks_per_node), "SLURM_NODEID": str(node),
            "SLURMD_NODENAME": f"node{node + 1}", "SLURM_STEP_NODELIST": names,
            "SLURM_STEP_NUM_NODES": str(nodes),
            "SLURM_STEP_TASKS_PER_NODE": f"{tasks_per_node}(x{nodes})"}


def _args(nnodes: str) -> argparse.Namespace:
    return argparse.Namespace(rdzv_backend="c10d", node_rank=None, standalone=False,
                              nnodes=nnodes)


@pytest.mark.parametrize(("nnodes", "nodes", "per_node", "dynamic"), [
    ("1:3", 2, 1, True),    # the other nodes' step of an elastic job: one task per node
    ("1:2", 1, 1, True),    # the first node's step of its own
    ("2", 1, 1, True),      # one task: no node ranks from srun (as before)
    ("2", 2, 1, False),     # a fixed count under srun: srun's node ranks (static)
    ("1:2", 1, 2, False),   # two tasks per node: each would be a node; the static refusal
])
def test_a_range_under_srun_one_task_per_node_takes_the_dynamic_rendezvous(
        nnodes: str, nodes: int, per_node: int, dynamic: bool) -> None:
    outer = detect(_step(nodes, per_node), argv=[])
    assert wanted(_args(nnodes), outer) is dynamic


def test_under_srun_the_node_named_as_the_endpoint_serves_it() -> None:
    """Both testbed nodes share one machine: only node1 (the endpoint's name) serves it,
    though node1's address is one of node2's machine's too."""
    first, second = (detect(_step(2, 1, node), argv=[]) for node in (0, 1))
    assert _serves_endpoint("node1", None, {}, first)
    assert not _serves_endpoint("node1", None, {}, second)
    assert _serves_endpoint("node2", "node2", {}, first)  # --local-addr wins


def test_same_address() -> None:
    assert same_address("127.0.0.1", "127.0.0.1")
    assert same_address("localhost", "127.0.0.1") or same_address("localhost", "::1")
    assert not same_address("127.0.0.1", "127.0.0.2")
    assert not same_address("no-such-host.invalid", "127.0.0.1")
