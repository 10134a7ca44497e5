"""The one planner: from a launch request and the outer launcher to the layout and each worker's
environment. ``unirank run`` and :class:`~unirank.runtime.parallel.Parallel` both ask it.

Everything here is pure: a :class:`LaunchRequest` (``unirank run``'s options or ``Parallel``'s
arguments), the outer :class:`DistEnv` (who started this process) and an environment mapping go
in; a :class:`Plan` comes out (:func:`unirank.supervisor.workerenv.worker_environ` gives the
exact environment of one of its workers). Nothing here starts a process, opens a socket or
imports torch.

The rules, in order (``L`` is the number of processes the outer launcher put on this node):

0. **Dynamic rendezvous** (``unirank run --rdzv-backend c10d`` without ``--node-rank``): the
   rendezvous's :class:`~unirank.supervisor.rdzv.spec.Assignment` gives the node rank, the node
   count, the ranks on each node (nodes may start different numbers of workers, as under
   torchrun) and the master; this process starts its node's workers.
1. ``standalone``: the outer launcher is ignored; one node, master ``127.0.0.1`` (unless given)
   on a free port (unless given). ``nnodes`` other than 1 is refused.
2. A Slurm allocation shell where no task was launched: one holding several tasks is refused
   (``DistEnv.require_launched``; ``unirank run`` re-executes itself through srun before
   planning); one holding a single task is a world of one process, as rule 5.
3. **In place** -- the launcher started several processes per node (``L > 1``, or more processes
   than nodes): each launched process is one rank, with the launcher's rank, local rank, world
   size and node. ``nproc_per_node`` must be unset or equal to ``L``. ``Parallel`` then runs the
   function in this process; ``unirank run`` starts one worker for this rank.
4. **Per node** -- the launcher started one process per node (``srun --ntasks-per-node=1``,
   ``mpirun --map-by ppr:1:node``): this process starts ``nproc_per_node`` workers, and the
   launcher's node count, node rank and master (address, port) are the world's. Without
   ``nproc_per_node`` it runs in place (``Parallel``) or uses ``spawn_default`` (``unirank run``).
5. **No launcher** (a world of one process): ``nproc_per_node`` workers (else ``spawn_default``;
   ``Parallel`` without either runs serially in place). One node unless ``nnodes`` says more;
   several nodes need ``node_rank`` and ``master_addr`` (or MASTER_ADDR). One node's master is
   ``master_addr`` if given, else ``127.0.0.1``: an inherited MASTER_ADDR is not used there (as
   torchrun, whose ``--master-addr`` defaults to ``127.0.0.1``), so a stale one from a shell
   profile cannot send the ranks elsewhere.

Everywhere: ``nnodes`` and ``node_rank`` given while the launcher also knows them must agree with
it (a ConfigError names both numbers); ``master_addr``/``master_port`` given win over the
launcher and the environment. The port is, in order: the option, MASTER_PORT
(``DistEnv.master_port_given``; not the one a torchrun agent of a single worker serves for
itself), a free port when this process starts every rank of the world, else the launcher's
(Slurm: derived from the job id) or 29500. ``Plan.master_source`` says where the master
address came from (``master_addr``, the launcher's source such as MASTER_ADDR, or empty for
the ``127.0.0.1`` default), for the one-line errors about it. Workers get
OMP_NUM_THREADS=1 only when more than one share the node (as torchrun).

Two more questions have their one answer here:

* **Which node runs rank r?** Consecutive ranks fill the nodes in node-rank order,
  ``Plan.ranks_per_node[n]`` of them on node ``n``: this process's workers, the same number on
  every node; in place, the launcher's count per node (srun's may be uneven:
  ``SLURM_STEP_TASKS_PER_NODE=2,1`` puts ranks 0-1 on the first node and rank 2 on the second),
  else the same count on every node where the world is that many times the nodes.
  :func:`node_index_of` answers it, for the supervisor and (through UNIRANK_RANKS_PER_NODE)
  for every worker.
* **Where does a node that refused to start tell the others?** :func:`giveup_address`: the
  master of the world of several nodes it was to join, where the request or the launcher
  names it; nowhere when no one does (the ``127.0.0.1`` a node picks for a world of its own is
  not where other nodes wait), nor for a world of one node.

Size: about 500 lines, over the ~400 of a module, on purpose. It is one pure decision,
:func:`make_plan`, whose rules (the 90 lines above) and the small functions that apply them
read together; a fifth is this docstring. Its records (:class:`LaunchRequest`, :class:`Plan`)
and its master rules would split off only with the request type in a module of its own, to
keep the master rules from importing the planner that imports them.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace

from unirank.contract import (
    DEFAULT_INIT_TIMEOUT,
    NO_SRUN_VAR,
    PRIVATE_VARIABLES,
)
from unirank.distenv import DistEnv
from unirank.errors import ConfigError
from unirank.placement import node_of as node_index_of
from unirank.rendezvous import DEFAULT_PORT
from unirank.resolve import master_addr_source
from unirank.store import uses_agent_store
from unirank.supervisor.rdzv.spec import Assignment

__all__ = [
    "IN_PLACE",
    "PRIVATE_VARIABLES",
    "SPAWN",
    "LaunchRequest",
    "Plan",
    "Worker",
    "giveup_address",
    "make_plan",
    "node_index_of",
]

#: this process starts the workers of its node
SPAWN = "spawn"
#: this process is one rank of a world the outer launcher started
IN_PLACE = "in_place"


@dataclass(frozen=True)
class LaunchRequest:
    """What the user asked for (``None``: not given).

    ``spawn_default`` is the number of workers to start when ``nproc_per_node`` is not given and
    no launcher placed processes here (``unirank run``: ``auto``'s answer); ``None`` runs in place
    instead (``Parallel``).
    """

    nproc_per_node: int | None = None
    nnodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    standalone: bool = False
    init_timeout: float = DEFAULT_INIT_TIMEOUT
    max_restarts: int = 0
    run_id: str | None = None
    role: str = "default"
    spawn_default: int | None = 1
    virtual_local_rank: bool = False
    #: torchrun's one-node rendezvous at ``localhost:0`` (``unirank run`` given no ``--nnodes``
    #: above 1, ``--master-port`` nor ``--rdzv-endpoint``): a node of its own is master
    #: ``localhost``, whatever MASTER_ADDR the shell exports, as torchrun's workers see; else
    #: ``127.0.0.1``, torchrun's ``--master-addr`` default
    stacked: bool = False


@dataclass(frozen=True)
class Worker:
    """One rank this process starts (or is, in place)."""

    rank: int
    local_rank: int


@dataclass(frozen=True)
class Plan:
    """The layout of the world, the workers this process starts, and their rendezvous.

    ``master_port`` 0 means "not chosen yet": the supervisor binds a free port (only possible
    when this process starts every rank) and calls :meth:`with_port`.
    """

    mode: str
    workers: tuple[Worker, ...]
    world_size: int
    local_world_size: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    run_id: str
    node_name: str
    hosts: tuple[str, ...] = ()
    init_timeout: float = DEFAULT_INIT_TIMEOUT
    launcher: str = "local"
    max_restarts: int = 0
    role: str = "default"
    virtual_local_rank: bool = False
    master_source: str = ""
    #: ranks on each node, in node-rank order (see :func:`node_index_of`); empty: not known
    ranks_per_node: tuple[int, ...] = ()

    @property
    def nproc_per_node(self) -> int:
        """Workers this process starts."""
        return len(self.workers)

    @property
    def hosts_store(self) -> bool:
        """True where rank 0 runs: that process opens the rendezvous port before its workers."""
        return any(w.rank == 0 for w in self.workers)

    def with_port(self, port: int) -> Plan:
        """This plan with the master port fixed (after the supervisor bound a free one)."""
        return replace(self, master_port=port)

    def dist_env(self, worker: Worker) -> DistEnv:
        """``worker``'s place in the world, as a :class:`DistEnv`."""
        return DistEnv(
            launcher="torchrun",
            rank=worker.rank,
            local_rank=worker.local_rank,
            world_size=self.world_size,
            local_world_size=self.local_world_size,
            node_rank=self.node_rank,
            num_nodes=self.nnodes,
            master_addr=self.master_addr,
            master_port=self.master_port,
            node_name=self.node_name,
            hosts=self.hosts,
        )


def _launcher_placement(outer: DistEnv) -> tuple[int, ...]:
    """The ranks on each of the outer launcher's nodes when each of its processes is one rank:
    its own counts where it gives them and they add up, else the same count on every node
    where the world is that many times the nodes, else unknown (empty)."""
    counts = outer.tasks_per_node
    if len(counts) == outer.num_nodes and sum(counts) == outer.world_size:
        return tuple(counts)
    if outer.world_size == outer.num_nodes * outer.local_world_size:
        return (outer.local_world_size,) * outer.num_nodes
    return ()


def _launcher_master(request: LaunchRequest, outer: DistEnv) -> tuple[str | None, int]:
    """The master of a world the outer launcher laid out: the options, else the launcher's
    (address None: neither names one)."""
    return (request.master_addr or outer.master_addr,
            request.master_port or outer.master_port or DEFAULT_PORT)


def _nodes_master(request: LaunchRequest, outer: DistEnv) -> tuple[str | None, int]:
    """The master of several nodes without a launcher: the options, else MASTER_ADDR and
    MASTER_PORT as exported, else port 29500 (address None: none was given)."""
    inherited = outer.master_addr if outer.master_addr_given else None
    port = request.master_port or (outer.master_port if outer.master_port_given else None)
    return request.master_addr or inherited, port or DEFAULT_PORT


def giveup_address(request: LaunchRequest, outer: DistEnv) -> tuple[str, int] | None:
    """Where this node tells the others that it refused to start its workers (node 0's store,
    at the master of the world of several nodes it was to join; see
    :mod:`unirank.supervisor.giveup`), or None when there is no one to tell: the world is one
    node, or no one named its master (no option, no MASTER_ADDR, no launcher's host list)."""
    if request.standalone:
        return None
    if outer.world_size > 1 and outer.num_nodes > 1:
        addr, port = _launcher_master(request, outer)
    elif (request.nnodes or 1) > 1:
        addr, port = _nodes_master(request, outer)
    else:
        return None
    return (addr, port) if addr else None


def _per_node_hint(outer: DistEnv) -> str:
    if outer.launcher.startswith("slurm"):
        return "start one launcher per node: srun --ntasks-per-node=1 ..."
    if outer.launcher in ("openmpi", "pmix"):
        return "start one launcher per node: mpirun --map-by ppr:1:node ..."
    if outer.launcher in ("mpich", "intelmpi", "mvapich"):
        return "start one launcher per node: mpiexec -ppn 1 ..."
    return "start one launcher per node, or drop the number of workers"


def _check_request(request: LaunchRequest) -> None:
    for name, value, least in (("nproc_per_node", request.nproc_per_node, 1),
                               ("nnodes", request.nnodes, 1),
                               ("node_rank", request.node_rank, 0),
                               ("max_restarts", request.max_restarts, 0)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < least):
            raise ConfigError(f"must be an integer >= {least}", variable=name,
                              value=repr(value), hint=f"pass {name}=<integer >= {least}>")
    port = request.master_port
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                             or not 0 < port < 65536):
        raise ConfigError("is outside 1..65535", variable="master_port", value=repr(port),
                          hint="pass a TCP port between 1 and 65535")


def _agree(name: str, given: int | None, known: int, outer: DistEnv, what: str) -> int:
    """``known`` (the launcher's), after checking that ``given`` (if any) says the same."""
    if given is not None and given != known:
        raise ConfigError(
            f"disagrees with the {outer.launcher} launcher, which gives {what} {known}",
            variable=name, value=str(given),
            hint=f"drop {name} (the launcher's {known} is used), or start the job with "
            "the layout you meant",
        )
    return known


def _run_id(request: LaunchRequest, outer: DistEnv, fallback: str | None) -> str:
    """THE run id: the request's, else the launcher's job (and step), else ``fallback``, else a
    fresh uuid4 (torchrun's for its one-node rendezvous)."""
    if request.run_id:
        return request.run_id
    if outer.job_id and not request.standalone:
        return outer.job_id if not outer.step_id else f"{outer.job_id}.{outer.step_id}"
    return fallback or str(uuid.uuid4())


def _master_of_launcher(request: LaunchRequest, outer: DistEnv) -> tuple[str, int]:
    """The master of a world the outer launcher laid out (a ConfigError where none is named)."""
    addr, port = _launcher_master(request, outer)
    if addr is None:  # the ConfigError that says which option or variable to set
        addr = outer.require_master(option="master_addr")[0]
    return addr, port


@dataclass(frozen=True)
class _Settings:
    """What every plan of one request carries besides its layout."""

    run_id: str
    node_name: str
    init_timeout: float
    launcher: str
    max_restarts: int
    role: str
    virtual_local_rank: bool


@dataclass(frozen=True)
class _Layout:
    """The world's shape, this process's workers, the master and the ranks on each node."""

    mode: str
    workers: tuple[Worker, ...]
    world_size: int
    local_world_size: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    hosts: tuple[str, ...]
    ranks_per_node: tuple[int, ...]


def _source(request: LaunchRequest, outer: DistEnv, layout: _Layout) -> str:
    """Where ``layout``'s master address came from: the request, the outer launcher (or an
    inherited MASTER_ADDR), or nowhere (the ``127.0.0.1`` default: empty)."""
    if request.master_addr:
        return "master_addr"
    if outer.master_addr and layout.master_addr == outer.master_addr:
        return master_addr_source(outer.sources)
    return ""


def _assemble(layout: _Layout, settings: _Settings, source: str) -> Plan:
    return Plan(
        mode=layout.mode, workers=layout.workers, world_size=layout.world_size,
        local_world_size=layout.local_world_size, nnodes=layout.nnodes,
        node_rank=layout.node_rank, master_addr=layout.master_addr,
        master_port=layout.master_port, hosts=layout.hosts, run_id=settings.run_id,
        node_name=settings.node_name, init_timeout=settings.init_timeout,
        launcher=settings.launcher, max_restarts=settings.max_restarts, role=settings.role,
        virtual_local_rank=settings.virtual_local_rank, master_source=source,
        ranks_per_node=layout.ranks_per_node,
    )


def _spawn(nproc: int, nnodes: int, node_rank: int, master: tuple[str, int],
           hosts: tuple[str, ...]) -> _Layout:
    workers = tuple(Worker(node_rank * nproc + local, local) for local in range(nproc))
    return _Layout(SPAWN, workers, nnodes * nproc, nproc, nnodes, node_rank, *master, hosts,
                   (nproc,) * nnodes)


def _rendezvoused(assignment: Assignment) -> _Layout:
    """Rule 0: this node's workers after a dynamic rendezvous; consecutive ranks fill the nodes
    in node-rank order."""
    node_rank = assignment.node_rank
    first = sum(assignment.ranks_per_node[:node_rank])
    nproc = assignment.ranks_per_node[node_rank]
    workers = tuple(Worker(first + local, local) for local in range(nproc))
    hosts = assignment.hosts if len(assignment.hosts) == assignment.nnodes else ()
    return _Layout(SPAWN, workers, sum(assignment.ranks_per_node), nproc, assignment.nnodes,
                   node_rank, assignment.master_addr, assignment.master_port, hosts,
                   assignment.ranks_per_node)


def _standalone(request: LaunchRequest, outer: DistEnv) -> DistEnv:
    """``--standalone``: one node on its own, with nothing given about the master."""
    if request.nnodes not in (None, 1):
        raise ConfigError("must be 1 with --standalone (one node on its own)",
                          variable="--nnodes", value=str(request.nnodes),
                          hint="drop --nnodes or --standalone")
    return DistEnv(launcher="local", node_name=outer.node_name)


def make_plan(
    request: LaunchRequest,
    outer: DistEnv,
    environ: Mapping[str, str],
    *,
    run_id_fallback: str | None = None,
    assignment: Assignment | None = None,
) -> Plan:
    """Lay out the world and this process's workers (see the module docstring for the rules).

    ``outer`` is what :func:`unirank.launchers.detect` found around this process (its
    ``node_name`` names this node to the workers); ``run_id_fallback`` becomes
    TORCHELASTIC_RUN_ID when neither the request nor the launcher gives one (None: a fresh
    uuid4); ``assignment``
    is this node's place after a dynamic rendezvous (rule 0).

    Reads: TORCHELASTIC_USE_AGENT_STORE (only without an outer launcher).
    """
    _check_request(request)
    if request.standalone:
        outer, environ = _standalone(request, outer), {}
    outer.require_launched(
        f"srun <your command> (unirank run starts it itself unless {NO_SRUN_VAR}=1)")
    settings = _Settings(
        run_id=_run_id(request, outer, run_id_fallback), node_name=outer.node_name,
        init_timeout=request.init_timeout, launcher=outer.launcher,
        max_restarts=request.max_restarts, role=request.role,
        virtual_local_rank=request.virtual_local_rank)
    if assignment is not None:
        layout = _rendezvoused(assignment)
    elif outer.world_size > 1:
        layout = _under_launcher(request, outer)
    else:
        layout = _without_launcher(request, outer, environ)
    return _assemble(layout, settings, _source(request, outer, layout))


def _under_launcher(request: LaunchRequest, outer: DistEnv) -> _Layout:
    """Rules 3 and 4: the outer launcher started several processes (in place), or one per node
    (this process starts the node's workers)."""
    nnodes = _agree("nnodes", request.nnodes, outer.num_nodes, outer, "a node count of")
    node_rank = _agree("node_rank", request.node_rank, outer.node_rank, outer,
                       "this node the rank")
    hosts = tuple(outer.hosts) if len(outer.hosts) == outer.num_nodes else ()
    one_per_node = outer.local_world_size == 1 and outer.world_size == outer.num_nodes
    nproc = request.nproc_per_node
    if one_per_node and (nproc is not None or request.spawn_default is not None):
        count = nproc if nproc is not None else request.spawn_default
        assert count is not None
        return _spawn(count, nnodes, node_rank, _master_of_launcher(request, outer), hosts)
    if nproc is not None and nproc != outer.local_world_size:
        raise ConfigError(
            f"disagrees with the {outer.launcher} launcher, which started "
            f"{outer.local_world_size} processes on this node (each one is a rank)",
            variable="nproc_per_node", value=str(nproc),
            hint=f"drop it, or pass {outer.local_world_size}, to run each process as "
            f"one rank; or {_per_node_hint(outer)}",
        )
    return _Layout(IN_PLACE, (Worker(outer.rank, outer.local_rank),), outer.world_size,
                   outer.local_world_size, nnodes, node_rank,
                   *_master_of_launcher(request, outer), hosts, _launcher_placement(outer))


def _without_launcher(request: LaunchRequest, outer: DistEnv,
                      environ: Mapping[str, str]) -> _Layout:
    """Rule 5: a world of one process; it runs in place, or starts ``nproc_per_node`` workers
    on each of ``nnodes`` nodes. Reads: TORCHELASTIC_USE_AGENT_STORE."""
    nproc = request.nproc_per_node if request.nproc_per_node is not None \
        else request.spawn_default
    nnodes = request.nnodes if request.nnodes is not None else 1
    if nproc is None:
        if nnodes != 1 or request.node_rank not in (None, 0):
            raise ConfigError(
                "only applies when this process starts workers", variable="nnodes",
                value=str(nnodes), hint="also pass nproc_per_node=<workers per node>",
            )
        return _Layout(IN_PLACE, (Worker(0, 0),), 1, 1, 1, 0, *outer.require_master(),
                       (outer.node_name,), (1,))
    node_rank = _node_rank_without_launcher(request, nnodes)
    if nnodes == 1:
        return _spawn(nproc, 1, node_rank, _one_node_master(request, outer, environ),
                      (outer.node_name,))
    addr, port = _nodes_master(request, outer)
    if addr is None:
        raise ConfigError(
            f"is needed with {nnodes} nodes: they must agree on the host of rank 0",
            variable="master_addr", value=None,
            hint="pass --master-addr <node 0's host name or address> on every node "
            "(or export MASTER_ADDR)",
        )
    return _spawn(nproc, nnodes, node_rank, (addr, port), ())


def _one_node_master(request: LaunchRequest, outer: DistEnv,
                     environ: Mapping[str, str]) -> tuple[str, int]:
    """Rule 5 on one node: ``master_addr``, else ``localhost`` for a stacked run
    (:attr:`LaunchRequest.stacked`), else ``127.0.0.1`` (never an inherited MASTER_ADDR); the
    port given (MASTER_PORT too, but not a torchrun agent's of one worker,
    which it serves itself), else 0: a free one. Reads: TORCHELASTIC_USE_AGENT_STORE."""
    given_port = outer.master_port if outer.master_port_given else None
    if uses_agent_store(environ):
        given_port = None
    default = "localhost" if request.stacked else "127.0.0.1"
    return request.master_addr or default, request.master_port or given_port or 0


def _node_rank_without_launcher(request: LaunchRequest, nnodes: int) -> int:
    if request.node_rank is None and nnodes > 1:
        raise ConfigError(
            f"is needed with {nnodes} nodes: each node must say which one it is (unirank's "
            "rendezvous is static, as torchrun's --rdzv-backend static)",
            variable="node_rank", value=None,
            hint="pass --node-rank <0..nnodes-1> on every node, or start one launcher per "
            "node with srun/mpirun, which gives it",
        )
    node_rank = request.node_rank or 0
    if node_rank >= nnodes:
        raise ConfigError(
            f"must be smaller than the number of nodes, {nnodes}", variable="node_rank",
            value=str(node_rank), hint="give each node a distinct node rank from 0 to nnodes-1",
        )
    return node_rank
