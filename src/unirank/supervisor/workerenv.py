"""The complete environment of one worker: the one function that builds it
(:func:`worker_environ`), from the plan and the engine's wiring (:class:`WorkerWiring`).

Pure: values in, a dict out. The engine (:mod:`.engine`) calls it at the moment
it starts each worker, once its pipes exist; ``tests/supervisor/test_workerenv.py`` keeps golden
copies of the result for a few layouts, so that any change to the contract shows up as a diff.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from unirank.contract import (
    ATTEMPT_DIR_VAR,
    DONE_FD_VAR,
    ELASTIC_VAR,
    ERROR_FILE_VAR,
    EXIT_TIMEOUT_VAR,
    FAULT_FILE_VAR,
    INIT_TIMEOUT_VAR,
    LINGER_FD_VAR,
    MAX_RESTARTS_VAR,
    NODE_NAME_VAR,
    NODE_NAMES_VAR,
    NUMA_BINDING_VAR,
    PRIVATE_VARIABLES,
    RANKS_PER_NODE_VAR,
    RESTART_COUNT_VAR,
    RESTART_REASON_VAR,
    RUN_ID_VAR,
    SIGNALS_TO_HANDLE_VAR,
    STATE_BUDGET_VAR,
    STATE_MEMORY_VAR,
    STORE_FD_VAR,
    SUPERVISOR_PID_VAR,
    TIMELINE_FILE_VAR,
    TIMELINE_VAR,
    USE_AGENT_STORE_VAR,
    HangSettings,
    format_seconds,
    resolve_hang,
)
from unirank.gpus import VISIBLE_DEVICES_VAR, own_gpu
from unirank.hostlist import compress, compress_tasks_per_node
from unirank.supervisor.plan import Plan, Worker

__all__ = ["WorkerWiring", "worker_environ"]


@dataclass(frozen=True)
class WorkerWiring:
    """What the engine gives one worker besides its place in the plan (``None``: not given)."""

    #: the supervisor's pid: the worker dies with it (UNIRANK_SUPERVISOR_PID)
    supervisor_pid: int | None = None
    #: which attempt this is (``--max-restarts``)
    restart_count: int = 0
    #: PYTHONUNBUFFERED=1 unless the user set it (output the supervisor tags or filters)
    unbuffered: bool = False
    #: where the worker records its failure (TORCHELASTIC_ERROR_FILE)
    error_file: str | None = None
    #: the attempt's folder (UNIRANK_ATTEMPT_DIR, :mod:`unirank.runfolder`)
    attempt_dir: str | None = None
    #: the node's snapshot memory (UNIRANK_STATE_MEMORY, :mod:`unirank.statekeep.memory`)
    state_memory: str | None = None
    #: ``--state-budget`` (UNIRANK_STATE_BUDGET; None: ``base``'s)
    state_budget: str | None = None
    #: rank 0: the listening socket its TCPStore server takes over (UNIRANK_STORE_FD)
    store_fd: int | None = None
    #: the store's host: the read end of the linger pipe (UNIRANK_LINGER_FD)
    linger_fd: int | None = None
    #: every other worker: the write end of its done pipe (UNIRANK_DONE_FD)
    done_fd: int | None = None
    #: ``--timeline``: when the supervisor started the worker (UNIRANK_TIMELINE)
    timeline_start: float | None = None
    #: rank 0: where to write the gathered end-of-run records (UNIRANK_TIMELINE_FILE)
    timeline_file: str | None = None
    #: where the worker's faulthandler writes a fatal signal's stack (UNIRANK_FAULT_FILE)
    fault_file: str | None = None
    #: ``--numa-binding``: the mode (UNIRANK_NUMA_BINDING, with the worker's local numbers)
    numa_binding: str | None = None
    #: the hang detector's settings (UNIRANK_HANG_REPORT_AFTER, UNIRANK_HANG_TIMEOUT,
    #: UNIRANK_HANG_INTERVAL); None: what ``base`` says (:func:`unirank.contract.resolve_hang`)
    hang: HangSettings | None = None
    #: the signals forwarded to the worker, by name (TORCHELASTIC_SIGNALS_TO_HANDLE)
    signals_to_handle: str | None = None
    #: a restarted attempt: why the one before ended (UNIRANK_RESTART_REASON, the value of
    #: :meth:`unirank.elasticstate.RestartReason.to_value`)
    restart_reason: str | None = None
    #: an elastic job's worker (UNIRANK_ELASTIC=1: ``on_hang="evict"`` is allowed there)
    elastic: bool = False


def _torchrun_environ(plan: Plan, worker: Worker, base: Mapping[str, str],
                      restart_count: int) -> dict[str, str]:
    """torchrun's contract for ``worker`` (see :func:`worker_environ`)."""
    env = dict(plan.dist_env(worker).torchrun_environ())
    env["ROLE_NAME"] = plan.role
    env[RUN_ID_VAR] = plan.run_id
    env[RESTART_COUNT_VAR] = str(restart_count)
    env[MAX_RESTARTS_VAR] = str(plan.max_restarts)
    env[USE_AGENT_STORE_VAR] = "True"
    env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = base.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if "OMP_NUM_THREADS" not in base and plan.local_world_size > 1:
        env["OMP_NUM_THREADS"] = "1"
    if plan.virtual_local_rank:  # each worker sees only its own GPU, as device 0
        env["LOCAL_RANK"] = "0"
        own = own_gpu(base, worker.local_rank)
        if own is not None:
            env[VISIBLE_DEVICES_VAR] = own
    return env


def _private_environ(plan: Plan, worker: Worker, wiring: WorkerWiring) -> dict[str, str]:
    """The bootstrap's private variables (removed before the program runs)."""
    env = {NODE_NAME_VAR: plan.node_name}
    if len(plan.hosts) == plan.nnodes:
        env[NODE_NAMES_VAR] = compress(plan.hosts)  # node[1-4096]: not O(nodes) a rank
    if plan.ranks_per_node:  # 4(x4096) or 2,1: which node runs each rank (node_index_of)
        env[RANKS_PER_NODE_VAR] = compress_tasks_per_node(plan.ranks_per_node)
    if plan.world_size > plan.nproc_per_node:  # ranks under other supervisors: exit barrier
        env[EXIT_TIMEOUT_VAR] = format_seconds(plan.init_timeout)
    for name, value in ((SUPERVISOR_PID_VAR, wiring.supervisor_pid),
                        (STORE_FD_VAR, wiring.store_fd), (LINGER_FD_VAR, wiring.linger_fd),
                        (DONE_FD_VAR, wiring.done_fd), (TIMELINE_FILE_VAR, wiring.timeline_file),
                        (FAULT_FILE_VAR, wiring.fault_file)):
        if value is not None:
            env[name] = str(value)
    if wiring.timeline_start is not None:
        env[TIMELINE_VAR] = repr(wiring.timeline_start)
    if wiring.numa_binding is not None:
        env[NUMA_BINDING_VAR] = (f"{wiring.numa_binding} {worker.local_rank}/"
                                 f"{plan.local_world_size}")
    return env


def worker_environ(plan: Plan, worker: Worker, base: Mapping[str, str],
                   wiring: WorkerWiring = WorkerWiring()) -> dict[str, str]:
    """The whole environment of ``worker``: ``base`` (less any private variable of an outer
    run) plus torchrun's contract, unirank's settings and the engine's wiring.

    Reads (from ``base``): UNIRANK_HANG_REPORT_AFTER, UNIRANK_HANG_TIMEOUT,
    UNIRANK_HANG_INTERVAL, OMP_NUM_THREADS, TORCH_NCCL_ASYNC_ERROR_HANDLING, PYTHONUNBUFFERED,
    CUDA_VISIBLE_DEVICES.

    Like torchrun: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
    GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT,
    TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS,
    TORCHELASTIC_USE_AGENT_STORE=True (rank 0's process hosts the store, so every rank is a
    store client), TORCHELASTIC_ERROR_FILE (one per worker and attempt),
    TORCHELASTIC_SIGNALS_TO_HANDLE (the signals forwarded, by name),
    TORCH_NCCL_ASYNC_ERROR_HANDLING (kept, else 1) and OMP_NUM_THREADS=1 when unset and more
    than one worker shares the node; with ``virtual_local_rank``, LOCAL_RANK=0 and
    CUDA_VISIBLE_DEVICES naming this worker's GPU. unirank adds UNIRANK_INIT_TIMEOUT, the hang
    detector's UNIRANK_HANG_REPORT_AFTER, UNIRANK_HANG_INTERVAL and UNIRANK_HANG_TIMEOUT (the
    wiring's settings, else those ``base`` gives; read and removed by the bootstrap),
    PYTHONUNBUFFERED=1 with ``wiring.unbuffered``, UNIRANK_ATTEMPT_DIR (the wiring's attempt
    folder), UNIRANK_STATE_MEMORY (the wiring's snapshot memory; one in ``base`` is dropped),
    UNIRANK_STATE_BUDGET (the wiring's ``--state-budget``, else ``base``'s),
    and for the bootstrap only the private
    UNIRANK_NODE_NAME, UNIRANK_NODE_NAMES (the nodes as a compressed host list),
    UNIRANK_RANKS_PER_NODE (the ranks on each node, where the plan knows them),
    UNIRANK_EXIT_TIMEOUT (when ranks run under other supervisors too), and what the wiring
    gives: UNIRANK_SUPERVISOR_PID, UNIRANK_STORE_FD, UNIRANK_LINGER_FD, UNIRANK_DONE_FD,
    UNIRANK_TIMELINE, UNIRANK_TIMELINE_FILE, UNIRANK_FAULT_FILE and UNIRANK_NUMA_BINDING. A
    restarted attempt's workers get UNIRANK_RESTART_REASON (the wiring's; one in ``base`` is
    dropped: it was another run's), an elastic job's UNIRANK_ELASTIC=1 (the same).
    """
    if plan.master_port == 0:
        raise ValueError("the master port is not chosen yet: call Plan.with_port first")
    env = {k: v for k, v in base.items()
           if k not in PRIVATE_VARIABLES
           and k not in (RESTART_REASON_VAR, ELASTIC_VAR, STATE_MEMORY_VAR)}
    env.update(_torchrun_environ(plan, worker, base, wiring.restart_count))
    if wiring.error_file is not None:
        env[ERROR_FILE_VAR] = wiring.error_file
    if wiring.attempt_dir is not None:
        env[ATTEMPT_DIR_VAR] = wiring.attempt_dir
    if wiring.state_memory is not None:
        env[STATE_MEMORY_VAR] = wiring.state_memory
    if wiring.state_budget is not None:
        env[STATE_BUDGET_VAR] = wiring.state_budget
    if wiring.signals_to_handle is not None:
        env[SIGNALS_TO_HANDLE_VAR] = wiring.signals_to_handle
    if wiring.restart_reason is not None:
        env[RESTART_REASON_VAR] = wiring.restart_reason
    if wiring.elastic:
        env[ELASTIC_VAR] = "1"
    if wiring.unbuffered and "PYTHONUNBUFFERED" not in base:
        env["PYTHONUNBUFFERED"] = "1"
    env[INIT_TIMEOUT_VAR] = format_seconds(plan.init_timeout)
    env.update((wiring.hang or resolve_hang(None, None, base)).environ())
    env.update(_private_environ(plan, worker, wiring))
    return env
