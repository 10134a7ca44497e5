"""``with Parallel(...) as p: p.run(fn, *args)``: one script, serial, launched or self-spawning.

What :meth:`Parallel.run` does depends on how the script was started (:func:`make_plan`):

* ``serial`` -- no launcher, no ``nproc_per_node``: ``fn(0, ...)`` runs here; a process group of
  one is started only when a backend was asked for explicitly.
* ``external`` -- a launcher (torchrun, srun, mpirun...) started several processes: each one
  initialises the process group and runs ``fn(local_rank, ...)``.
* ``spawn`` -- ``nproc_per_node`` given and no launcher already placed several processes on this
  node: this process starts ``nproc_per_node`` workers itself. Under a launcher that started one
  process per node (``srun --ntasks-per-node=1``, ``mpirun`` with one rank per node), the
  launcher's ranks become node ranks, so several nodes work without extra arguments.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any

from unirank.distenv import DistEnv
from unirank.errorfile import record_exception
from unirank.errors import ConfigError
from unirank.rendezvous import explicit_master
from unirank.runtime import lifecycle, state
from unirank.runtime.spawn import WorkerSpec, host_store, run_workers, worker_environ

__all__ = ["Parallel", "Plan", "make_plan", "worker_envs"]

SERIAL = "serial"
EXTERNAL = "external"
SPAWN = "spawn"


@dataclass(frozen=True)
class Plan:
    """How :class:`Parallel` runs: ``mode`` and, for ``spawn``, the local world's shape."""

    mode: str
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    #: False when a busy port may be swapped for a free one (one node, no port given)
    port_fixed: bool = True


def _check_int(name: str, value: int | None, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(
            f"must be an integer >= {minimum}",
            variable=name,
            value=repr(value),
            hint=f"pass {name}=<integer >= {minimum}>",
        )
    return value


def _agree(name: str, given: int | None, launched: int, where: str) -> int:
    if given is not None and given != launched:
        raise ConfigError(
            f"disagrees with the launcher, which gives {launched} ({where})",
            variable=name,
            value=str(given),
            hint=f"drop {name}, or launch one task per node accordingly",
        )
    return launched


def make_plan(
    env: DistEnv,
    environ: Mapping[str, str],
    *,
    nproc_per_node: int | None = None,
    nnodes: int | None = None,
    node_rank: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
) -> Plan:
    """Decide the mode for a process described by ``env`` (see the module docstring).

    Reads: MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE (from ``environ``).
    Raises ConfigError for inconsistent arguments.
    """
    nproc = _check_int("nproc_per_node", nproc_per_node, 1)
    nodes = _check_int("nnodes", nnodes, 1)
    node = _check_int("node_rank", node_rank, 0)
    port = _check_int("master_port", master_port, 1)
    if port is not None and port > 65535:
        raise ConfigError(
            "is outside 1..65535", variable="master_port", value=str(port),
            hint="pass a TCP port between 1 and 65535",
        )
    if nproc is None:
        extra = [
            name
            for name, value in (
                ("nnodes", nodes), ("node_rank", node),
                ("master_addr", master_addr), ("master_port", port),
            )
            if value is not None
        ]
        if extra:
            raise ConfigError(
                "only apply when this process spawns workers",
                variable=extra[0],
                value=str({"nnodes": nodes, "node_rank": node, "master_addr": master_addr,
                           "master_port": port}[extra[0]]),
                hint="also pass nproc_per_node=<workers per node>, or drop these arguments",
            )
        return Plan(EXTERNAL if env.world_size > 1 else SERIAL)
    if env.world_size > 1 and env.local_world_size > 1:
        _agree("nproc_per_node", nproc, env.local_world_size,
               f"{env.launcher} started {env.local_world_size} processes on this node")
        return Plan(EXTERNAL)
    if env.world_size > 1:
        # one launched process per node: the launcher's ranks are node ranks
        where = f"{env.launcher} started one process on each of {env.world_size} nodes"
        nodes = _agree("nnodes", nodes, env.world_size, where)
        node = _agree("node_rank", node, env.rank, where)
        outer_addr, outer_port = env.require_master()
        return Plan(SPAWN, nproc, nodes, node, master_addr or outer_addr, port or outer_port, True)
    nodes = nodes or 1
    if node is None and nodes > 1:
        raise ConfigError(
            f"is needed when nnodes={nodes}", variable="node_rank", value=None,
            hint="pass node_rank=<index of this node, 0 on the master node>",
        )
    node = node or 0
    if node >= nodes:
        raise ConfigError(
            f"must be smaller than nnodes={nodes}", variable="node_rank", value=str(node),
            hint="node ranks run from 0 to nnodes-1",
        )
    env_addr, env_port = explicit_master(environ)
    addr = master_addr or env_addr
    if addr is None:
        if nodes > 1:
            raise ConfigError(
                f"is needed when nnodes={nodes}", variable="master_addr", value=None,
                hint="pass master_addr=<host of node rank 0> (or export MASTER_ADDR)",
            )
        addr = env.master_addr or "127.0.0.1"
    if environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and nodes == 1:
        env_port = None  # a torchrun agent of one worker serves MASTER_PORT itself: not ours
    chosen = port or env_port
    fixed = chosen is not None or nodes > 1
    return Plan(SPAWN, nproc, nodes, node, addr, chosen or env.master_port or 29500, fixed)


def worker_envs(plan: Plan, env: DistEnv, node_name: str) -> list[DistEnv]:
    """The DistEnv of each worker this node spawns under ``plan``."""
    world = plan.nnodes * plan.nproc_per_node
    hosts = env.hosts if len(env.hosts) == plan.nnodes else ()
    note = "unirank.Parallel"
    return [
        DistEnv(
            launcher="parallel",
            rank=plan.node_rank * plan.nproc_per_node + local_rank,
            local_rank=local_rank,
            world_size=world,
            local_world_size=plan.nproc_per_node,
            node_rank=plan.node_rank,
            num_nodes=plan.nnodes,
            master_addr=plan.master_addr,
            master_port=plan.master_port,
            job_id=env.job_id,
            step_id=env.step_id,
            node_name=node_name,
            hosts=hosts,
            sources={"launcher": note},
        )
        for local_rank in range(plan.nproc_per_node)
    ]


class Parallel:
    """Context manager that runs ``fn(local_rank, *args, **kwargs)`` on every rank.

    ``backend``: ``None`` (no process group when serial, ``auto`` otherwise), ``"auto"``,
    ``"gloo"``, ``"nccl"``... ``nproc_per_node``: spawn this many local workers (see
    :func:`make_plan`); ``nnodes``, ``node_rank``, ``master_addr``, ``master_port`` describe a
    multi-node spawn when no launcher does. ``init_timeout``: seconds every rank waits for the
    others to join (default ``UNIRANK_INIT_TIMEOUT``, else 300).

    Reads: the launcher's variables (through :func:`~unirank.runtime.state.dist_env`),
    MASTER_ADDR, MASTER_PORT, OMP_NUM_THREADS, UNIRANK_INIT_TIMEOUT, SLURMD_NODENAME.
    """

    def __init__(
        self,
        backend: str | None = None,
        nproc_per_node: int | None = None,
        nnodes: int | None = None,
        node_rank: int | None = None,
        master_addr: str | None = None,
        master_port: int | None = None,
        init_timeout: float | None = None,
    ) -> None:
        self.backend = backend
        self.init_timeout = init_timeout
        self._spawn_args: dict[str, Any] = {
            "nproc_per_node": nproc_per_node,
            "nnodes": nnodes,
            "node_rank": node_rank,
            "master_addr": master_addr,
            "master_port": master_port,
        }
        self.plan: Plan | None = None
        self._finalize = False

    def __enter__(self) -> Parallel:
        env = state.dist_env()
        lifecycle.require_launched(env, sys.argv, sys.executable)
        if self.init_timeout is not None:
            lifecycle.resolve_init_timeout(self.init_timeout, os.environ)
        plan = make_plan(env, os.environ, **self._spawn_args)
        self.plan = plan
        wants_group = plan.mode == EXTERNAL or (plan.mode == SERIAL and self.backend is not None)
        if wants_group and not state.is_initialized():
            lifecycle.init(self.backend, self.init_timeout)
            self._finalize = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._finalize:
            self._finalize = False
            lifecycle.finalize()

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Call ``fn(local_rank, *args, **kwargs)`` on every rank (spawning workers if planned)."""
        if self.plan is None:
            with self:
                self.run(fn, *args, **kwargs)
            return
        if self.plan.mode != SPAWN:
            try:
                fn(state.get_local_rank(), *args, **kwargs)
            except BaseException as exc:
                record_exception(exc)  # now, before the group goes away and peers fail too
                raise
            return
        self._spawn(self.plan, fn, args, kwargs)

    def _spawn(
        self, plan: Plan, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        timeout = lifecycle.resolve_init_timeout(self.init_timeout, os.environ)
        store = None
        if plan.node_rank == 0:
            store, port = host_store(
                plan.master_addr, plan.master_port, port_fixed=plan.port_fixed, timeout=timeout
            )
            plan = replace(plan, master_port=port)
        specs = [
            WorkerSpec(
                env=worker,
                environ=worker_environ(worker, os.environ),
                backend=self.backend,
                init_timeout=self.init_timeout,
                parent_pid=os.getpid(),
            )
            for worker in worker_envs(plan, state.dist_env(), state.hostname())
        ]
        try:
            run_workers(specs, fn, args, kwargs)
        finally:
            del store
