"""The processes SkyPilot's ``run:`` command starts: the same command once on every node.

SkyPilot gives each node ``SKYPILOT_NODE_RANK`` (0..N-1), ``SKYPILOT_NUM_NODES``,
``SKYPILOT_NODE_IPS`` (the nodes' addresses, one per line, in node-rank order; the first is the
head node) and ``SKYPILOT_NUM_GPUS_PER_NODE``, and ``SKYPILOT_TASK_ID`` (unique per task run).
It starts one process per node, so this process is rank ``SKYPILOT_NODE_RANK`` of a world of
``SKYPILOT_NUM_NODES``: ``python train.py`` runs one rank per node, and ``unirank run train.py``
(rule 4 of :mod:`unirank.supervisor.plan`) starts the node's workers in a world of nodes x
workers. The master is the first line of ``SKYPILOT_NODE_IPS`` (``MASTER_ADDR`` wins), on a
port derived from ``SKYPILOT_TASK_ID`` (``MASTER_PORT`` wins; 29500 without a task id).
"""

from __future__ import annotations

from collections.abc import Mapping

from unirank.distenv import DistEnv
from unirank.envvars import check_rank, read_int
from unirank.errors import ConfigError
from unirank.launchers._base import Context, Launcher, Layout, MasterHint, finish

NAME = "skypilot"
NODE_RANK = "SKYPILOT_NODE_RANK"
NUM_NODES = "SKYPILOT_NUM_NODES"
NODE_IPS = "SKYPILOT_NODE_IPS"
GPUS_PER_NODE = "SKYPILOT_NUM_GPUS_PER_NODE"
TASK_ID = "SKYPILOT_TASK_ID"
KEYS = (NODE_RANK, NUM_NODES)


def node_ips(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The nodes' addresses, in node-rank order (empty lines skipped). Reads: SKYPILOT_NODE_IPS."""
    return tuple(line.strip() for line in environ.get(NODE_IPS, "").splitlines() if line.strip())


def gpus_per_node(environ: Mapping[str, str]) -> int | None:
    """``SKYPILOT_NUM_GPUS_PER_NODE`` as a count (0 on CPU nodes), None when unset.

    Reads: SKYPILOT_NUM_GPUS_PER_NODE.
    """
    if not environ.get(GPUS_PER_NODE, "").strip():
        return None
    return read_int(environ, GPUS_PER_NODE, minimum=0,
                    hint="SkyPilot sets it to the accelerator count of `resources:`")


def _num_nodes(environ: Mapping[str, str], ips: tuple[str, ...]) -> int:
    """``SKYPILOT_NUM_NODES``, checked against the lines of ``SKYPILOT_NODE_IPS``."""
    num_nodes = read_int(environ, NUM_NODES, minimum=1,
                         hint="SkyPilot sets it to the task's `num_nodes:`")
    if ips and len(ips) != num_nodes:
        raise ConfigError(
            f"lists {len(ips)} address(es) but {NUM_NODES}={num_nodes}",
            variable=NODE_IPS, value=environ[NODE_IPS],
            hint="SkyPilot writes one address per line, one per node; were the variables "
            "copied from another task?",
        )
    return num_nodes


def detect(environ: Mapping[str, str], ctx: Context) -> DistEnv | None:
    """A node's process under SkyPilot, or None.

    Reads: SKYPILOT_NODE_RANK, SKYPILOT_NUM_NODES, SKYPILOT_NODE_IPS,
    SKYPILOT_NUM_GPUS_PER_NODE (checked), SKYPILOT_TASK_ID, MASTER_ADDR, MASTER_PORT,
    SLURMD_NODENAME, UNIRANK_NODE_NAME.
    """
    if NODE_RANK not in environ or NUM_NODES not in environ:
        return None
    ips = node_ips(environ)
    num_nodes = _num_nodes(environ, ips)
    node_rank = read_int(environ, NODE_RANK, hint="SkyPilot sets it to 0..num_nodes-1")
    check_rank(node_rank, num_nodes, rank_var=NODE_RANK, size_var=NUM_NODES)
    gpus_per_node(environ)
    layout = Layout(
        rank=node_rank, world_size=num_nodes, node_rank=node_rank, num_nodes=num_nodes,
        sources={
            "rank": f"{NODE_RANK} (one process per node)",
            "world_size": f"{NUM_NODES} (one process per node)",
            "local_rank": "default: one process per node",
            "local_world_size": "default: one process per node",
            "node_rank": NODE_RANK,
            "num_nodes": NUM_NODES,
            **({"hosts": NODE_IPS} if ips else {}),
        },
    )
    task = environ.get(TASK_ID, "").strip() or None
    return finish(
        NAME, environ, ctx, layout,
        master=MasterHint(ips, NODE_IPS, task, job_source=TASK_ID),
        hosts=ips, tasks_per_node=(1,) * num_nodes if ips else (),
        job_id=(task, TASK_ID if task else ""),
        own_node=(ips[node_rank], f"line {NODE_RANK} of {NODE_IPS}") if ips else None,
    )


def _absent(environ: Mapping[str, str]) -> str | None:
    if NODE_IPS in environ and (NODE_RANK not in environ or NUM_NODES not in environ):
        return f"{NODE_IPS} is set, but not {NODE_RANK} and {NUM_NODES} (a setup: phase?)"
    return None


LAUNCHER = Launcher(NAME, detect, keys=KEYS, absent_reason=_absent)
