"""How one attempt's workers start on this node: :func:`attempt_launches` (each worker's
command line, environment base, wiring and output), the node's fork server's environment
(:func:`configure_server`), and what an attempt's workers are told of the hang settings
(:func:`attempt_hang`). Used by :mod:`.attempts`; never imports torch.

Reads no environment variable (the ``environ`` it is given is the workers' base).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from unirank.contract import HangSettings, on_slow_now
from unirank.runfolder import AttemptFolder
from unirank.signals import format_signals
from unirank.supervisor.engineoptions import EngineOptions
from unirank.supervisor.fork.client import ForkServer, server_environ
from unirank.supervisor.plan import Plan
from unirank.supervisor.workerenv import WorkerWiring, worker_environ

if TYPE_CHECKING:
    from unirank.supervisor.engine import WorkerLaunch

__all__ = ["attempt_hang", "attempt_launches", "configure_server", "handled_signals"]


def attempt_launches(plan: Plan, argv: tuple[str, ...], environ: Mapping[str, str],
                     options: EngineOptions, restart_count: int, attempt_dir: str,
                     store_fd: int | None, keep_logs: bool, *,
                     restart_reason: str | None = None,
                     state_memory: str | None = None) -> list[WorkerLaunch]:
    """How to start each of this node's workers for an attempt after ``restart_count``
    restarts spent (:mod:`.budget`; TORCHELASTIC_RESTART_COUNT): its command line,
    environment base and wiring (error file in ``attempt_dir``, the store's listening
    ``store_fd`` for rank 0, the timeline, why the attempt before ended, the run's snapshot
    memory), and where its output goes."""
    from unirank.supervisor.engine import WorkerLaunch

    out = options.output
    folders = AttemptFolder(attempt_dir)
    launches = []
    for worker in plan.workers:
        # torchrun's layout: one folder per local rank, made before the worker starts, so that
        # torch's @record can write its error file there
        os.makedirs(folders.worker(worker.local_rank), exist_ok=True)
        wiring = WorkerWiring(
            supervisor_pid=os.getpid(), restart_count=restart_count,
            unbuffered=out.unbuffered,
            error_file=folders.error_file(worker.local_rank), attempt_dir=attempt_dir,
            fault_file=folders.fault_file(worker.local_rank),
            numa_binding=options.numa_binding,
            signals_to_handle=handled_signals(options),
            store_fd=store_fd if worker.rank == 0 else None,
            timeline_file=folders.timeline_file if worker.rank == 0 else None,
            hang=attempt_hang(options, plan), restart_reason=restart_reason,
            elastic=options.elastic,
            state_memory=state_memory, state_budget=options.state_budget,
        )
        files = out.log_files(worker.local_rank, folders) if keep_logs else (None, None)
        shown = out.shown(worker.local_rank)
        launches.append(WorkerLaunch(
            worker.rank, worker.local_rank, argv, plan, worker, environ, wiring,
            timeline=options.timeline,
            stdout_console=shown and not out.redirected(worker.local_rank, 1),
            stderr_console=shown and not out.redirected(worker.local_rank, 2),
            stdout_file=files[0], stderr_file=files[1],
            prefix=out.prefix(worker.rank, worker.local_rank, plan.role),
            console_prefixes=tuple(  # type: ignore[arg-type]
                out.tee_prefix(worker.rank, worker.local_rank, plan.role)
                if out.teed(worker.local_rank, bit) else None for bit in (1, 2)),
            stdout_copy=(out.line_copy(worker.local_rank, 1, folders, plan.role)
                         if keep_logs else None),
            stderr_copy=(out.line_copy(worker.local_rank, 2, folders, plan.role)
                         if keep_logs else None),
        ))
    return launches


def handled_signals(options: EngineOptions) -> str:
    """The workers' TORCHELASTIC_SIGNALS_TO_HANDLE."""
    return options.signals_to_handle or format_signals(options.signals)


def configure_server(server: ForkServer, plan: Plan, environ: Mapping[str, str],
                     options: EngineOptions) -> None:
    """Give the fork server the environment this node's workers have in common (once: a
    server configured already, as an elastic node's before its first round, keeps it)."""
    wiring = WorkerWiring(supervisor_pid=os.getpid(), unbuffered=options.output.unbuffered,
                          signals_to_handle=handled_signals(options))
    server.configure(server_environ([worker_environ(plan, w, environ, wiring)
                                     for w in plan.workers]))


def attempt_hang(options: EngineOptions, plan: Plan) -> HangSettings | None:
    """The hang settings of an attempt's workers: ``--on-slow evict`` only while this attempt's
    world may lose a node (:func:`unirank.contract.on_slow_now`)."""
    hang = options.hang
    if hang is None:
        return None
    return replace(hang, on_slow=on_slow_now(hang.on_slow, plan.nnodes, options.min_nodes))
