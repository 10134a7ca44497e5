"""What the MPI launchers share: ranks from four variables, the master from host-naming ones.

MPI launchers export ranks but not hosts. The master address is taken, in order, from
``MASTER_ADDR``; the batch system around mpirun (first host of ``SLURM_JOB_NODELIST``, of
``LSB_MCPU_HOSTS`` or the first line of ``PBS_NODEFILE``); ``127.0.0.1`` when every rank is on
this node; otherwise it is unknown and ``DistEnv.require_master`` asks for ``MASTER_ADDR``.
Node rank and node count assume ranks are placed by slot (mpirun's default ``--map-by slot``,
``-ppn``): node = rank // local size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from unirank.distenv import DistEnv
from unirank.envvars import check_rank, first_set, read_int
from unirank.errors import ConfigError
from unirank.launchers import slurm_vars as V
from unirank.launchers._base import Context, Layout, MasterHint, by_slot, finish
from unirank.launchers.slurm import hosts_of

__all__ = ["MpiVars", "batch_hosts", "build"]


@dataclass(frozen=True)
class MpiVars:
    """The variable names one MPI flavour uses (first present wins for the tuples)."""

    rank: str
    size: str
    local_rank: tuple[str, ...]
    local_size: tuple[str, ...]
    job_id: tuple[str, ...] = ()


def batch_hosts(environ: Mapping[str, str], ctx: Context) -> tuple[tuple[str, ...], str]:
    """Hosts of the batch job around an MPI launch, and the variable that named them.

    Reads: SLURM_JOB_NODELIST / SLURM_NODELIST, LSB_MCPU_HOSTS, PBS_NODEFILE (reads the file).
    """
    found = hosts_of(environ, V.JOB_NODELIST)
    if found[1]:
        return found
    if environ.get("LSB_MCPU_HOSTS", "").strip():
        words = environ["LSB_MCPU_HOSTS"].split()
        return tuple(dict.fromkeys(words[0::2])), "LSB_MCPU_HOSTS"
    if environ.get("PBS_NODEFILE", "").strip():
        from unirank.launchers.pbs import read_nodefile

        lines = read_nodefile(environ, ctx)
        return tuple(dict.fromkeys(lines)), "PBS_NODEFILE"
    return (), ""


def _scheduler_job_id(environ: Mapping[str, str]) -> tuple[str | None, str]:
    name = first_set(environ, *V.JOB_ID, "LSB_JOBID", "PBS_JOBID")
    return (environ[name], name) if name else (None, "")


def _layout(names: MpiVars, environ: Mapping[str, str], hosts: tuple[str, ...],
            hosts_var: str) -> Layout:
    """Ranks from the flavour's four variables; without local ones, spread evenly over
    ``hosts`` or all on one node. Reads: the variables ``names`` lists."""
    rank = read_int(environ, names.rank)
    world = read_int(environ, names.size, minimum=1)
    check_rank(rank, world, rank_var=names.rank, size_var=names.size)
    local_rank_var = first_set(environ, *names.local_rank)
    local_size_var = first_set(environ, *names.local_size)
    sources = {"rank": names.rank, "world_size": names.size}
    if local_rank_var and local_size_var:
        local_rank = read_int(environ, local_rank_var)
        local_world = read_int(environ, local_size_var, minimum=1)
        check_rank(local_rank, local_world, rank_var=local_rank_var, size_var=local_size_var)
        sources.update(local_rank=local_rank_var, local_world_size=local_size_var)
    elif hosts and world % len(hosts) == 0:
        local_world = world // len(hosts)
        local_rank = rank % local_world
        sources.update(
            local_rank=f"derived: {names.rank} mod local size",
            local_world_size=f"derived: {names.size} / hosts in {hosts_var}",
        )
    else:
        local_rank, local_world = rank, world
        sources.update(
            local_rank=f"derived: {names.rank} (no local rank variable; one node assumed)",
            local_world_size=f"derived: {names.size} (one node assumed)",
        )
    if local_world > world:
        raise ConfigError(
            f"is larger than {names.size}={world}",
            variable=local_size_var, value=str(local_world),
            hint="the launcher's variables disagree; variables left over from an outer job?",
        )
    node_rank, num_nodes = by_slot(rank, world, local_world)
    sources.update(
        num_nodes=f"derived: {names.size} / local size",
        node_rank=f"derived: {names.rank} // local size (ranks placed by slot)",
    )
    if hosts:
        sources["hosts"] = hosts_var
    return Layout(rank, local_rank, world, local_world, node_rank, num_nodes, sources)


def build(
    name: str,
    names: MpiVars,
    environ: Mapping[str, str],
    ctx: Context,
    *,
    hosts: tuple[str, ...] | None = None,
    hosts_var: str = "",
) -> DistEnv:
    """A DistEnv for an MPI rank whose flavour uses the variable names ``names``.

    ``hosts`` overrides the batch system's host list (:func:`batch_hosts`); when it is given and
    the flavour has no local size variable, ranks are taken to be spread evenly over it.

    Reads: the four rank variables of ``names``, its job id variables, the batch system's host
    variables (:func:`batch_hosts`), SLURM_STEP_ID, SLURMD_NODENAME, UNIRANK_NODE_NAME,
    MASTER_ADDR, MASTER_PORT.
    """
    if hosts is None:
        hosts, hosts_var = batch_hosts(environ, ctx)
    layout = _layout(names, environ, hosts, hosts_var)
    jid_var = first_set(environ, *names.job_id)
    if jid_var:
        jid: tuple[str | None, str] = (environ[jid_var], jid_var)
        step = None
    else:
        jid = _scheduler_job_id(environ)
        step = V.step_id(environ)[0]
    return finish(name, environ, ctx, layout,
                  master=MasterHint(hosts, hosts_var, jid[0], step, jid[1]),
                  hosts=hosts, job_id=jid)
