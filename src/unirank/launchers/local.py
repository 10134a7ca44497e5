"""No launcher: a single process, rank 0 of 1."""

from __future__ import annotations

from collections.abc import Mapping

from unirank.distenv import DistEnv
from unirank.launchers._base import Context, resolve_master

NAME = "local"
KEYS: tuple[str, ...] = ()


def detect(environ: Mapping[str, str], ctx: Context) -> DistEnv:
    """Rank 0 of a world of 1 on this machine.

    Reads: MASTER_ADDR, MASTER_PORT (kept so a later ``unirank run`` can reuse them).
    """
    master = resolve_master(environ, single_node=True)
    return DistEnv(
        launcher=NAME,
        master_addr=master.addr,
        master_port=master.port,
        node_name=ctx.hostname,
        hosts=(ctx.hostname,),
        sources={
            "rank": "default: no launcher detected",
            "world_size": "default: no launcher detected",
            "master_addr": master.addr_source,
            "master_port": master.port_source,
            "node_name": "socket.gethostname()",
        },
    )
