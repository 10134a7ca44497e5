"""Tasks started by PBS Pro / Torque's ``pbsdsh`` (one task per line of ``PBS_NODEFILE``).

``PBS_NODEFILE`` lists one line per slot, a host repeated once per slot; ``pbsdsh`` gives each task
``PBS_VNODENUM``, its line's index, which is its rank. A PBS batch shell without
``PBS_VNODENUM`` is not a task: ranks there come from the MPI launcher the script runs.
"""

from __future__ import annotations

from collections.abc import Mapping

from unirank.distenv import DistEnv
from unirank.envvars import check_rank, read_int
from unirank.errors import ConfigError
from unirank.launchers._base import Context, Launcher, Layout, MasterHint, finish

NAME = "pbs"


def read_nodefile(environ: Mapping[str, str], ctx: Context) -> list[str]:
    """The lines of ``PBS_NODEFILE``, one host per slot. Reads: PBS_NODEFILE (and the file)."""
    path = environ.get("PBS_NODEFILE", "")
    try:
        text = ctx.read_text(path)
    except OSError as exc:
        raise ConfigError(
            f"cannot be read ({exc.strerror or exc})", variable="PBS_NODEFILE", value=path,
            hint="run inside the PBS job, where PBS writes this file",
        ) from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise ConfigError(
            "names an empty file", variable="PBS_NODEFILE", value=path,
            hint="the job has no hosts; check the #PBS -l select/nodes line",
        )
    return lines


def detect(environ: Mapping[str, str], ctx: Context) -> DistEnv | None:
    """A pbsdsh task, or None.

    Reads: PBS_JOBID, PBS_VNODENUM, PBS_NODEFILE (and the file), MASTER_ADDR, MASTER_PORT,
    SLURMD_NODENAME, UNIRANK_NODE_NAME.
    """
    if "PBS_JOBID" not in environ or "PBS_VNODENUM" not in environ:
        return None
    if "PBS_NODEFILE" not in environ:
        raise ConfigError(
            "is not set, so the job's hosts are unknown", variable="PBS_NODEFILE", value=None,
            hint="run the task with pbsdsh inside the PBS job",
        )
    lines = read_nodefile(environ, ctx)
    rank = read_int(environ, "PBS_VNODENUM")
    check_rank(rank, len(lines), rank_var="PBS_VNODENUM", size_var="lines of PBS_NODEFILE")
    host = lines[rank]
    hosts = tuple(dict.fromkeys(lines))
    layout = Layout(
        rank=rank,
        local_rank=lines[:rank].count(host),
        world_size=len(lines),
        local_world_size=lines.count(host),
        node_rank=hosts.index(host),
        num_nodes=len(hosts),
        sources={
            "rank": "PBS_VNODENUM",
            "world_size": "lines of PBS_NODEFILE",
            "local_rank": "derived: earlier lines of PBS_NODEFILE naming this host",
            "local_world_size": "derived: lines of PBS_NODEFILE naming this host",
            "node_rank": "derived: host's place in PBS_NODEFILE",
            "num_nodes": "distinct hosts of PBS_NODEFILE",
            "hosts": "PBS_NODEFILE",
        },
    )
    jid = (environ["PBS_JOBID"], "PBS_JOBID")
    return finish(NAME, environ, ctx, layout,
                  master=MasterHint(hosts, "PBS_NODEFILE", jid[0], job_source=jid[1]),
                  hosts=hosts, job_id=jid, own_node=(host, "PBS_NODEFILE line PBS_VNODENUM"))


LAUNCHER = Launcher(NAME, detect, keys=("PBS_JOBID", "PBS_VNODENUM"))
