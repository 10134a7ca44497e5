"""One process per pod, as Kubeflow's PyTorchJob starts it (any plain ``env://`` launch, too).

The training operator sets ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` and ``RANK`` but no
``LOCAL_RANK``: each pod is one node with one process. (With ``nprocPerNode`` > 1 the pod runs
torchrun, whose workers are detected as torchrun.)
"""

from __future__ import annotations

from collections.abc import Mapping

from unirank.distenv import DistEnv
from unirank.envvars import check_rank, read_int
from unirank.launchers._base import Context, Launcher, Layout, finish

NAME = "kubeflow"
KEYS = ("RANK", "WORLD_SIZE", "MASTER_ADDR")


def detect(environ: Mapping[str, str], ctx: Context) -> DistEnv | None:
    """A PyTorchJob pod's process, or None.

    Reads: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK (must be unset),
    SLURMD_NODENAME, UNIRANK_NODE_NAME.
    """
    if "LOCAL_RANK" in environ or not all(key in environ for key in KEYS):
        return None
    rank = read_int(environ, "RANK")
    world = read_int(environ, "WORLD_SIZE", minimum=1)
    check_rank(rank, world, rank_var="RANK", size_var="WORLD_SIZE")
    sources = {
        "rank": "RANK",
        "world_size": "WORLD_SIZE",
        "local_rank": "default: one process per pod",
        "local_world_size": "default: one process per pod",
        "node_rank": "RANK (one process per pod)",
        "num_nodes": "WORLD_SIZE (one process per pod)",
    }
    layout = Layout(rank=rank, world_size=world, node_rank=rank, num_nodes=world,
                    sources=sources)
    return finish(NAME, environ, ctx, layout)


LAUNCHER = Launcher(NAME, detect, keys=KEYS)
