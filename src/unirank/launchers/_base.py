"""What every launcher module shares: the launcher entry, the detection context, the node name,
master resolution, and :func:`finish`, which turns what a launcher read into a :class:`DistEnv`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from unirank.contract import NODE_NAME_VAR
from unirank.distenv import DistEnv
from unirank.launchers import slurm_vars
from unirank.placement import by_slot
from unirank.rendezvous import derive_port, explicit_master

__all__ = [
    "Context",
    "Launcher",
    "Layout",
    "Master",
    "MasterHint",
    "by_slot",
    "finish",
    "node_name",
    "resolve_master",
]


def _read_text(path: str) -> str:
    return Path(path).read_text()


@dataclass(frozen=True)
class Context:
    """Inputs of detection besides the environment.

    ``argv`` is the process's command line (torch.distributed.launch passes ``--local-rank``);
    ``read_text`` reads a file that a variable names (LSB_DJOB_RANKFILE, PBS_NODEFILE): tests pass
    a dict lookup; ``hostname`` is this machine's name, used when nothing else names the node.
    """

    argv: Sequence[str] = ()
    read_text: Callable[[str], str] = _read_text
    hostname: str = "localhost"


Detect = Callable[[Mapping[str, str], Context], "DistEnv | None"]


@dataclass(frozen=True)
class Launcher:
    """One launcher unirank detects: an entry of :data:`unirank.launchers.PRECEDENCE`.

    ``detect`` is pure: the environment and a :class:`Context` in, this process's DistEnv out, or
    None when the launcher's variables are absent (a ConfigError when they are inconsistent).
    ``keys`` are the variables that select it (``explain`` names the missing ones);
    ``aliases`` are other names it reports and ``UNIRANK_LAUNCHER`` accepts (``intelmpi``);
    ``srun_pmi``: ``srun --mpi=pmi2|pmix`` sets its variables too, so when its numbers equal the
    Slurm step's, the step (which also knows the nodes) is reported; ``absent_reason`` says why
    it did not match when its variables are there (``explain``).
    """

    name: str
    detect: Detect
    keys: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    srun_pmi: bool = False
    absent_reason: Callable[[Mapping[str, str]], str | None] | None = None


@dataclass(frozen=True)
class Master:
    """The rendezvous host and port, where each came from, and whether MASTER_* gave it."""

    addr: str | None
    port: int | None
    addr_source: str
    port_source: str
    addr_given: bool = False
    port_given: bool = False


@dataclass(frozen=True)
class MasterHint:
    """What a launcher knows that names the master: hosts (the first is the master) and the ids
    a port is derived from (:func:`unirank.rendezvous.derive_port`)."""

    hosts: tuple[str, ...] = ()
    hosts_source: str = ""
    job_id: str | None = None
    step_id: str | None = None
    job_source: str = ""


def resolve_master(environ: Mapping[str, str], hint: MasterHint = MasterHint(), *,
                   single_node: bool = False) -> Master:
    """Master address and port by unirank's rules (see :mod:`unirank.rendezvous`).

    Reads: MASTER_ADDR, MASTER_PORT.
    """
    addr, port = explicit_master(environ)
    addr_given, port_given = addr is not None, port is not None
    addr_source = "MASTER_ADDR"
    if addr is None:
        if hint.hosts:
            addr, addr_source = hint.hosts[0], f"first host of {hint.hosts_source}"
        elif single_node:
            addr, addr_source = "127.0.0.1", "default: whole world on one node"
        else:
            addr_source = "unknown: set MASTER_ADDR"
    port_source = "MASTER_PORT"
    if port is None:
        port = derive_port(hint.job_id, hint.step_id)
        port_source = f"derived from {hint.job_source}" if hint.job_id else "default 29500"
    return Master(addr, port, addr_source, port_source, addr_given, port_given)


def node_name(environ: Mapping[str, str], ctx: Context,
              own: tuple[str, str] | None = None) -> tuple[str, str]:
    """This node's name and where it came from; the one rule every launcher and the runtime use.

    In order:

    1. ``SLURMD_NODENAME``: under Slurm, slurmd's name for the node (on some clusters every node
       has the same host name, and an srun task inherits the batch shell's ``HOSTNAME``);
    2. ``own``: the launcher's own name for the node, with its source (a PBS_NODEFILE line,
       ``HOROVOD_HOSTNAME``, a Slurm step's host list entry);
    3. ``UNIRANK_NODE_NAME``: the name ``unirank run`` or ``Parallel`` gave the node of the
       workers it started (so a worker names its node as its supervisor does);
    4. the host name (``ctx.hostname``: ``socket.gethostname()``).

    Reads: SLURMD_NODENAME, UNIRANK_NODE_NAME.
    """
    slurm_name = environ.get(slurm_vars.NODENAME, "").strip()
    if slurm_name:
        return slurm_name, slurm_vars.NODENAME
    if own is not None and own[0].strip():
        return own[0].strip(), own[1]
    given = environ.get(NODE_NAME_VAR, "").strip()
    if given:
        return given, NODE_NAME_VAR
    return ctx.hostname, "socket.gethostname()"


@dataclass(frozen=True)
class Layout:
    """This process's place, as a launcher read it, and where each number came from."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    sources: Mapping[str, str] = field(default_factory=dict)


def finish(
    launcher: str,
    environ: Mapping[str, str],
    ctx: Context,
    layout: Layout,
    *,
    master: MasterHint = MasterHint(),
    hosts: tuple[str, ...] = (),
    tasks_per_node: tuple[int, ...] = (),
    job_id: tuple[str | None, str] = (None, ""),
    step_id: tuple[str | None, str] = (None, ""),
    own_node: tuple[str, str] | None = None,
    launch_required: bool = False,
    planned_tasks: int | None = None,
) -> DistEnv:
    """The DistEnv of ``layout``: the master resolved, the node named (:func:`node_name`), the
    job's ids, hosts and processes per host, and ``sources`` completed. ``launch_required`` and
    ``planned_tasks`` describe a Slurm allocation shell where no task was launched (see
    :class:`DistEnv`).

    Reads: MASTER_ADDR, MASTER_PORT, SLURMD_NODENAME, UNIRANK_NODE_NAME.
    """
    sources = dict(layout.sources)
    found = resolve_master(environ, master,
                           single_node=layout.num_nodes == 1 or layout.world_size == 1)
    node, sources["node_name"] = node_name(environ, ctx, own_node)
    sources.update(master_addr=found.addr_source, master_port=found.port_source)
    for name, (value, source) in (("job_id", job_id), ("step_id", step_id)):
        if value is not None and source:
            sources[name] = source
    return DistEnv(
        launcher=launcher,
        rank=layout.rank,
        local_rank=layout.local_rank,
        world_size=layout.world_size,
        local_world_size=layout.local_world_size,
        node_rank=layout.node_rank,
        num_nodes=layout.num_nodes,
        master_addr=found.addr,
        master_port=found.port,
        master_addr_given=found.addr_given,
        master_port_given=found.port_given,
        job_id=job_id[0],
        step_id=step_id[0],
        node_name=node,
        hosts=hosts,
        tasks_per_node=tasks_per_node,
        launch_required=launch_required,
        planned_tasks=planned_tasks,
        sources=sources,
    )
