"""The one rule that names this node, through every launcher; the launcher entries; by_slot."""

from __future__ import annotations

import pytest

from unirank.launchers import LAUNCHER_NAMES, PRECEDENCE, detect, node_name
from unirank.launchers._base import Context, by_slot

SRUN_TASK = {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1",
             "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_NTASKS": "2",
             "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_NUM_NODES": "2",
             "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}
HOROVOD = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "1", "HOROVOD_LOCAL_RANK": "0",
           "HOROVOD_LOCAL_SIZE": "1", "HOROVOD_HOSTNAME": "hvd-host"}
TORCHRUN = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "m",
            "MASTER_PORT": "1"}
KUBEFLOW = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "m"}
ALLOCATION = {"SLURM_JOB_ID": "5", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n[1-2]",
              "SLURM_JOB_NUM_NODES": "2"}
OPENMPI = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}


def test_order_slurm_then_the_launcher_s_own_then_unirank_s_then_the_host() -> None:
    ctx = Context(hostname="box")
    full = {"SLURMD_NODENAME": "nid1", "UNIRANK_NODE_NAME": "given"}
    assert node_name(full, ctx, ("own", "X")) == ("nid1", "SLURMD_NODENAME")
    assert node_name({"UNIRANK_NODE_NAME": "given"}, ctx, ("own", "X")) == ("own", "X")
    assert node_name({"UNIRANK_NODE_NAME": " given "}, ctx) == ("given", "UNIRANK_NODE_NAME")
    assert node_name({"SLURMD_NODENAME": " ", "UNIRANK_NODE_NAME": ""}, ctx, (" ", "X")) == (
        "box", "socket.gethostname()")


@pytest.mark.parametrize(("environ", "plain", "launcher_s"), [
    (SRUN_TASK, "n2", "n2"),            # the step's host list names node 1
    (HOROVOD, "hvd-host", "hvd-host"),  # HOROVOD_HOSTNAME
    (TORCHRUN, "box", "given"),
    (KUBEFLOW, "box", "given"),
    (ALLOCATION, "box", "given"),       # an salloc shell runs where salloc was typed
    (OPENMPI, "box", "given"),
    ({}, "box", "given"),               # local
])
def test_every_launcher_names_the_node_by_the_one_rule(environ: dict[str, str], plain: str,
                                                       launcher_s: str) -> None:
    """Without SLURMD_NODENAME: the launcher's own name, else UNIRANK_NODE_NAME, else the host;
    with it, Slurm's name wins everywhere (also over a stale HOSTNAME variable)."""
    assert detect({**environ, "HOSTNAME": "stale"}, argv=[], hostname="box").node_name == plain
    given = {**environ, "UNIRANK_NODE_NAME": "given"}
    assert detect(given, argv=[], hostname="box").node_name == launcher_s
    slurm = {**given, "SLURMD_NODENAME": "nid9"}
    env = detect(slurm, argv=[], hostname="box")
    assert (env.node_name, env.sources["node_name"]) == ("nid9", "SLURMD_NODENAME")


def test_a_worker_names_its_node_as_its_supervisor_did() -> None:
    """``unirank run`` under horovodrun: the supervisor's node is HOROVOD_HOSTNAME; its worker
    (torchrun's variables, the same HOROVOD_* ones) gets it through UNIRANK_NODE_NAME."""
    outer = detect(HOROVOD, argv=[], hostname="box")
    worker = detect({**HOROVOD, **TORCHRUN, "UNIRANK_NODE_NAME": outer.node_name}, argv=[],
                    hostname="box")
    assert (outer.launcher, worker.launcher) == ("horovodrun", "torchrun")
    assert worker.node_name == outer.node_name == "hvd-host"


def test_launcher_entries_are_typed_and_named_once() -> None:
    names = [entry.name for entry in PRECEDENCE]
    assert len(set(names)) == len(names)
    assert PRECEDENCE[-1].name == "local" and PRECEDENCE[-1].keys == ()
    assert LAUNCHER_NAMES["intelmpi"] is LAUNCHER_NAMES["mpich"]
    assert {e.name for e in PRECEDENCE if e.srun_pmi} == {"mpich", "pmix"}
    assert all(callable(e.detect) for e in PRECEDENCE)


@pytest.mark.parametrize(("rank", "world", "local", "expected"), [
    (0, 4, 2, (0, 2)), (3, 4, 2, (1, 2)), (4, 5, 2, (2, 3)), (2, 3, 4, (0, 1)),
])
def test_by_slot(rank: int, world: int, local: int, expected: tuple[int, int]) -> None:
    assert by_slot(rank, world, local) == expected


def test_master_given_is_carried_by_the_dist_env() -> None:
    env = detect({"MASTER_PORT": "1234"}, argv=[], hostname="box")
    assert (env.master_port, env.master_port_given, env.master_addr_given) == (1234, True, False)
    step = detect(SRUN_TASK, argv=[], hostname="box")
    assert not step.master_port_given and not step.master_addr_given
    given = detect({**SRUN_TASK, "MASTER_ADDR": "h"}, argv=[], hostname="box")
    assert (given.master_addr, given.master_addr_given) == ("h", True)
