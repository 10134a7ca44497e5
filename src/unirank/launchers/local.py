"""No launcher: a single process, rank 0 of 1."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from unirank.distenv import DistEnv
from unirank.launchers._base import Context, Launcher, Layout, finish

NAME = "local"


def detect(environ: Mapping[str, str], ctx: Context) -> DistEnv:
    """Rank 0 of a world of 1 on this machine.

    Reads: MASTER_ADDR, MASTER_PORT (kept so a later ``unirank run`` can reuse them),
    SLURMD_NODENAME, UNIRANK_NODE_NAME.
    """
    sources = {"rank": "default: no launcher detected",
               "world_size": "default: no launcher detected"}
    env = finish(NAME, environ, ctx, Layout(sources=sources))
    return replace(env, hosts=(env.node_name,))


LAUNCHER = Launcher(NAME, detect)
