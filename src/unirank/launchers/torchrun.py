"""Workers of ``torchrun`` / ``python -m torch.distributed.run`` / ``torch.distributed.launch``.

Also every worker that ``unirank run`` starts, since those get torchrun's variables, and a Ray
Train worker (``TorchTrainer`` sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and NODE_RANK,
its node's rank, which is used where GROUP_RANK is unset). The legacy
``torch.distributed.launch`` without ``--use-env`` passes the local rank as ``--local-rank=N``
(or ``--local_rank N``) on the command line instead of ``LOCAL_RANK``.

Inside a Slurm step (``srun torchrun ...``), the torchrun variables win for ranks, but the number
of torchrun agents must be the number of srun tasks, and with a static rendezvous each agent's
``GROUP_RANK`` must be its ``SLURM_PROCID`` (= ``SLURM_NODEID`` with one task per node); a
mismatch would hang, so it is a ConfigError naming the numbers that disagree.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from unirank.contract import RUN_ID_VAR
from unirank.distenv import DistEnv
from unirank.envvars import check_rank, first_set, read_int, read_optional_int
from unirank.errors import ConfigError
from unirank.launchers import slurm
from unirank.launchers import slurm_vars as V
from unirank.launchers._base import Context, Launcher, Layout, by_slot, finish
from unirank.words import counted

NAME = "torchrun"

_LOCAL_RANK_ARG = re.compile(r"^--local[-_]rank(?:=(.*))?$")


def local_rank_from_argv(argv: Sequence[str]) -> str | None:
    """The value of ``--local-rank=N`` / ``--local_rank N`` in ``argv``, or None."""
    for i, arg in enumerate(argv):
        match = _LOCAL_RANK_ARG.match(arg)
        if match:
            if match.group(1) is not None:
                return match.group(1)
            return argv[i + 1] if i + 1 < len(argv) else ""
    return None


def present(environ: Mapping[str, str], argv: Sequence[str]) -> bool:
    """True when torchrun's variables (or launch's ``--local-rank``) are there.

    Reads: TORCHELASTIC_RUN_ID, LOCAL_RANK, RANK, WORLD_SIZE.
    """
    if RUN_ID_VAR in environ:
        return True
    has_local = "LOCAL_RANK" in environ or local_rank_from_argv(argv) is not None
    return has_local and "RANK" in environ and "WORLD_SIZE" in environ


def _check_against_slurm(environ: Mapping[str, str], node_rank: int, num_nodes: int) -> None:
    """Inside ``srun``, with the static rendezvous (run id ``none``): one torchrun agent per
    task, and node ranks that match the tasks'. A run id names a dynamic rendezvous, whose
    world is the nodes that met (``unirank sbatch --nnodes MIN:MAX`` starts the first node in
    a step of its own; a lost node's survivors go on in a step of more tasks).

    Reads: SLURM_STEP_NUM_TASKS / SLURM_NTASKS, SLURM_PROCID, SLURM_NODEID, TORCHELASTIC_RUN_ID.
    """
    tasks_var = first_set(environ, *V.STEP_NUM_TASKS)
    static = environ.get(RUN_ID_VAR, "none") in ("none", "")
    if tasks_var is None or not static:
        return
    tasks = read_int(environ, tasks_var, minimum=1)
    if num_nodes != tasks:
        raise ConfigError(
            f"torchrun runs {counted(num_nodes, 'node')} (GROUP_WORLD_SIZE / --nnodes) but srun "
            "started "
            f"{counted(tasks, 'torchrun task')}",
            variable=tasks_var, value=environ[tasks_var],
            hint=f"use srun --ntasks-per-node=1 -N {num_nodes}, or torchrun --nnodes {tasks}",
        )
    procid = read_int(environ, V.PROCID)
    if node_rank != procid:
        nodeid = environ.get(V.NODEID, "?")
        raise ConfigError(
            f"torchrun's node rank GROUP_RANK={node_rank} disagrees with this srun task's "
            f"{V.PROCID}={procid} ({V.NODEID}={nodeid})",
            variable="GROUP_RANK", value=str(node_rank),
            hint=f"pass torchrun --node_rank ${V.NODEID} (in single quotes, so each task expands "
            "it), or use unirank run, which reads it itself",
        )


def _layout(environ: Mapping[str, str], ctx: Context) -> Layout:
    """Ranks, local ranks and nodes from torchrun's variables, checked against each other.

    Reads: RANK, LOCAL_RANK (or ``--local-rank``), WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
    GROUP_WORLD_SIZE, NODE_RANK (Ray Train's, where GROUP_RANK is unset).
    """
    rank = read_int(environ, "RANK", hint="torchrun sets RANK for every worker")
    world = read_int(environ, "WORLD_SIZE", minimum=1, hint="torchrun sets WORLD_SIZE")
    check_rank(rank, world, rank_var="RANK", size_var="WORLD_SIZE")
    sources: dict[str, str] = {"rank": "RANK", "world_size": "WORLD_SIZE"}
    if "LOCAL_RANK" in environ:
        local_rank = read_int(environ, "LOCAL_RANK")
        sources["local_rank"] = "LOCAL_RANK"
    else:
        arg = local_rank_from_argv(ctx.argv)
        local_rank = read_int({"--local-rank": arg or ""}, "--local-rank")
        sources["local_rank"] = "--local-rank argument"
    groups = read_optional_int(environ, "GROUP_WORLD_SIZE", minimum=1)
    local_world = read_optional_int(environ, "LOCAL_WORLD_SIZE", minimum=1)
    if local_world is not None:
        sources["local_world_size"] = "LOCAL_WORLD_SIZE"
    elif groups is not None and world % groups == 0:
        local_world = world // groups
        sources["local_world_size"] = "derived: WORLD_SIZE / GROUP_WORLD_SIZE"
    else:
        local_world = world
        sources["local_world_size"] = "derived: assumed one node (LOCAL_WORLD_SIZE unset)"
    check_rank(local_rank, local_world, rank_var=sources["local_rank"],
               size_var="LOCAL_WORLD_SIZE")
    slot_node, num_nodes = by_slot(rank, world, local_world)
    sources["num_nodes"] = "derived: WORLD_SIZE / LOCAL_WORLD_SIZE"
    if groups is not None:
        num_nodes, sources["num_nodes"] = groups, "GROUP_WORLD_SIZE"
    node_rank = read_optional_int(environ, "GROUP_RANK")
    if node_rank is not None:
        sources["node_rank"] = "GROUP_RANK"
    elif (ray_node := read_optional_int(environ, "NODE_RANK")) is not None:
        # Ray Train gives each worker its node's rank; it may place different numbers of
        # workers on its nodes, so the slot rule below can be wrong there
        node_rank, sources["node_rank"] = ray_node, "NODE_RANK"
        if groups is None and node_rank >= num_nodes:
            num_nodes, sources["num_nodes"] = node_rank + 1, "derived: at least NODE_RANK + 1"
    else:
        node_rank, sources["node_rank"] = slot_node, "derived: RANK // LOCAL_WORLD_SIZE"
    check_rank(node_rank, num_nodes, rank_var="GROUP_RANK", size_var=sources["num_nodes"])
    return Layout(rank, local_rank, world, local_world, node_rank, num_nodes, sources)


def detect(environ: Mapping[str, str], ctx: Context) -> DistEnv | None:
    """A torchrun worker, or None when torchrun's variables are absent.

    Reads: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
    NODE_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID, SLURMD_NODENAME,
    UNIRANK_NODE_NAME, and the Slurm step variables for the consistency check.
    """
    if not present(environ, ctx.argv):
        return None
    layout = _layout(environ, ctx)
    hosts: tuple[str, ...] = ()
    sources = dict(layout.sources)
    if slurm.in_step(environ):
        _check_against_slurm(environ, layout.node_rank, layout.num_nodes)
        hosts, hosts_var = slurm.hosts_of(environ, V.STEP_NODELIST)
        if hosts:
            sources["hosts"] = hosts_var
    run_id = environ.get(RUN_ID_VAR)
    jid = V.job_id(environ)
    if jid[0] is None and run_id not in (None, "", "none"):
        jid = (run_id, RUN_ID_VAR)
    step = (V.step_id(environ)[0], "")
    return finish(NAME, environ, ctx, replace(layout, sources=sources), hosts=hosts,
                  job_id=jid, step_id=step)


LAUNCHER = Launcher(NAME, detect,
                    keys=("LOCAL_RANK", "RANK", "WORLD_SIZE", RUN_ID_VAR, "--local-rank"))
