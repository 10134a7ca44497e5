"""Starting and ending the process group: :func:`init` and :func:`finalize`.

:func:`init` opens the rendezvous store (:func:`unirank.store.open_store` on the master address
and port; rank 0 serves it unless ``TORCHELASTIC_USE_AGENT_STORE=True`` says an agent already
does, as ``torchrun``, ``unirank run`` and :class:`~unirank.runtime.parallel.Parallel` arrange),
has every rank announce itself so that ranks that never join are named within the init timeout
(in a worker of ``unirank run``, whose bootstrap already joined, the bootstrap's wrapper of
``init_process_group`` does it instead, bounded by ``--init-timeout``:
:mod:`unirank.supervisor.worker.groupstart`), then has the chosen backend's entry
(:mod:`unirank.runtime.backends`) start its group on that store. A rank that no worker
bootstrap started (srun, mpirun, torchrun one task per rank) starts its hang watcher here
(:mod:`unirank.hang.watcher`), on a store connection of its own.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from unirank import contract
from unirank.contract import DEFAULT_INIT_TIMEOUT
from unirank.distenv import DistEnv
from unirank.gpus import gpus_bound_per_task
from unirank.launchers.slurm_allocation import launch_command
from unirank.resolve import master_addr_source
from unirank.runtime import backends, ignite_options, state
from unirank.runtime.boundworld import release_bound_world
from unirank.runtime.snapshotstaging import BACKGROUND
from unirank.store import (
    StoreError,
    interrupted,
    open_store,
    take_joined,
    uses_agent_store,
)
from unirank.storekeys.init import init_prefix

__all__ = [
    "DEFAULT_INIT_TIMEOUT",
    "InitError",
    "finalize",
    "hang_settings",
    "init",
    "launch_command",
    "require_launched",
    "resolve_init_timeout",
]

class InitError(RuntimeError):
    """The process group could not be started (the rendezvous store is unreachable...)."""


def resolve_init_timeout(timeout: float | None, environ: Mapping[str, str],
                         keyword: str = "init_timeout") -> float:
    """The init timeout in seconds: ``timeout`` if given (an error names ``keyword``, the one the
    caller used), else ``UNIRANK_INIT_TIMEOUT``, else 300
    (:func:`unirank.contract.resolve_init_timeout`). Reads: UNIRANK_INIT_TIMEOUT.
    """
    return contract.resolve_init_timeout(timeout, environ, option=keyword)


def require_launched(env: DistEnv, argv: Sequence[str], executable: str) -> None:
    """Raise ConfigError in a Slurm allocation shell whose tasks must be started through srun
    (:attr:`DistEnv.must_launch <unirank.distenv.DistEnv.must_launch>`: more than one task),
    naming the srun command for this program. A shell holding one task runs at world size 1.
    """
    env.require_launched(launch_command(argv, executable))


def _connect_store(env: DistEnv, timeout: float, environ: Mapping[str, str]) -> Any:
    """The rendezvous TCPStore: served by rank 0, or a client of the agent's store.

    Reads: TORCHELASTIC_USE_AGENT_STORE.
    """
    addr, port = env.require_master()
    serve = env.rank == 0 and not uses_agent_store(environ)
    try:
        return open_store(
            addr, port, rank=env.rank, timeout=timeout, serve=serve, multi_tenant=serve,
            hint="check that rank 0 (or the launcher's agent) runs and that MASTER_ADDR and "
                 "MASTER_PORT name it; raise UNIRANK_INIT_TIMEOUT if it starts late",
            addr_source=master_addr_source(env.sources), environ=environ,
        )
    except StoreError as exc:  # its one line says it all: no chained traceback repeating it
        raise InitError(str(exc)) from None


def _joined_store(env: DistEnv, timeout: float, generation: int) -> Any:
    """The store this init's group starts on, once every rank has joined (the join watchdog,
    :mod:`unirank.joincheck`), under this attempt's and init's key prefix. The first init in a
    worker whose bootstrap already ran the join check takes the store it joined on
    (:func:`unirank.store.take_joined`) and does not join here: the bootstrap's wrapper of
    ``init_process_group`` has every rank join at the group's start
    (:mod:`unirank.supervisor.worker.groupstart`).

    The prefix names the init, not the restart: every attempt has a store of its own (rank 0's
    worker serves a new one under ``unirank run``; torchrun's agent makes one per round), and
    the restart count is each node's own (a node that joined an elastic job starts at 0 while
    the others count their restarts), so it must not part the ranks of one group.

    Reads: TORCHELASTIC_USE_AGENT_STORE.
    """
    environ = os.environ
    addr, port = env.require_master()
    prefix = init_prefix(generation)
    base = take_joined(rank=env.rank, world_size=env.world_size, addr=addr, port=port)
    if base is not None:
        base.set_timeout(timedelta(seconds=timeout))
    else:
        base = _connect_store(env, timeout, environ)
        _join(base, prefix, env, timeout)
    return dist.PrefixStore(f"{prefix}/pg", base)  # type: ignore[attr-defined]


def hang_settings(report_after: str | float | None, timeout: str | float | None,
                   environ: Mapping[str, str]) -> contract.HangSettings | None:
    """The hang detector's settings from :func:`init`'s keywords, else the variables (None:
    neither keyword given). Reads: UNIRANK_HANG_REPORT_AFTER, UNIRANK_HANG_TIMEOUT,
    UNIRANK_HANG_INTERVAL."""
    if report_after is None and timeout is None:
        return None
    return contract.resolve_hang(report_after, timeout, environ,
                                 names=contract.HANG_KEYWORDS)


def ask_on_hang(on_hang: str | None, environ: Mapping[str, str]) -> None:
    """:func:`init`'s ``on_hang=`` keyword: checked by the one parser of ``--on-hang``
    (:func:`unirank.contract.resolve_on_hang`: errors name the keyword; ``evict`` only in an
    elastic job, which ``unirank run`` marks with UNIRANK_ELASTIC), then written in the
    attempt's folder, where this rank's supervisor reads it at a hang timeout
    (:func:`unirank.contract.on_hang_now`). Without a unirank supervisor (no attempt folder:
    torchrun, srun...) the launcher decides what follows a hang timeout.

    Reads: UNIRANK_ELASTIC, UNIRANK_ATTEMPT_DIR.
    """
    if on_hang is None:
        return
    choice = contract.resolve_on_hang(on_hang, {}, restarts=0, option="on_hang",
                                      elastic=contract.flag(environ, contract.ELASTIC_VAR))
    folder = environ.get(contract.ATTEMPT_DIR_VAR)
    if folder:
        from unirank.runfolder import AttemptFolder

        path = AttemptFolder(folder).on_hang_asked
        with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as fh:
            fh.write(choice + "\n")


def _watch_hangs(env: DistEnv, timeout: float, environ: Any,
                 given: contract.HangSettings | None) -> None:
    """Start this rank's hang watcher, unless the detector is off or a worker's bootstrap
    started one already (which then takes ``given``: :func:`init`'s keywords); the flight
    recorder is turned on before the group starts.

    Reads: UNIRANK_HANG_REPORT_AFTER, UNIRANK_HANG_TIMEOUT, UNIRANK_HANG_INTERVAL,
    TORCH_FR_BUFFER_SIZE.
    """
    from unirank.hang import watcher

    settings = given or contract.resolve_hang(None, None, environ)
    running = watcher.running()
    if running is not None and given is not None:
        running.reconfigure(given)
    if settings.report_after is None or running is not None:
        return
    addr, port = env.require_master()

    def connect() -> Any:
        return open_store(addr, port, rank=env.rank, timeout=timeout, hint="")

    job = None
    if env.local_rank == 0:  # this node's job file, for `unirank stacks`
        job = {"run_id": environ.get(contract.RUN_ID_VAR) or env.job_id or f"{addr}:{port}",
               "master_addr": addr, "master_port": port}
    started = watcher.Watcher(rank=env.rank, world_size=env.world_size, node=state.hostname(),
                              settings=settings, connect=connect, environ=environ,
                              job=job).start()
    if watcher.running() is started:  # torch's collective timeout: the hang's report first
        sys.excepthook = watcher.excepthook_with_report(sys.excepthook)


def _file_store(env: DistEnv, url: str, timeout: float, generation: int) -> Any:
    """The store of an ``init_method="file://PATH"`` group: a ``FileStore`` in PATH (which every
    rank must see), joined as on unirank's own store (the join watchdog), under this init's key
    prefix. No master address is needed."""
    path = urllib.parse.urlparse(url).path
    base = dist.FileStore(path, env.world_size)  # type: ignore[attr-defined]
    base.set_timeout(timedelta(seconds=timeout))
    prefix = init_prefix(generation)
    _join(base, prefix, env, timeout)
    return dist.PrefixStore(f"{prefix}/pg", base)  # type: ignore[attr-defined]


def _join(base: Any, prefix: str, env: DistEnv, timeout: float) -> None:
    """Every rank announces itself under ``prefix/join`` and waits for the others (the join
    watchdog names ranks that never come); Ctrl-C ends the wait with one line."""
    from unirank.joincheck import announce_and_wait

    try:
        announce_and_wait(
            dist.PrefixStore(f"{prefix}/join", base),  # type: ignore[attr-defined]
            rank=env.rank,
            world_size=env.world_size,
            node_name=state.hostname(),
            timeout=timeout,
        )
    except KeyboardInterrupt:
        interrupted(env.rank, "waiting for the other ranks to join")


def _adopt(given: float | None, keyword: str, hang_report_after: str | float | None,
           hang_timeout: str | float | None, on_hang: str | None = None) -> None:
    """A group unirank did not start: watch it for hangs as one unirank starts (a client of
    the store at the master address and port, which the group's ``env://`` rendezvous serves),
    where a world of several ranks names its master; else leave it alone.

    Reads: what :func:`init` reads for the hang detector and the launcher.
    """
    if state.STATE.owns_group:
        return
    environ = os.environ
    ask_on_hang(on_hang, environ)
    env = state.dist_env()
    if env.world_size > 1 and env.master_addr is not None and env.master_port is not None:
        _watch_hangs(env, resolve_init_timeout(given, environ, keyword), environ,
                     hang_settings(hang_report_after, hang_timeout, environ))


def _all_started(base: Any, env: DistEnv, timeout: float) -> None:
    """Wait until every rank's group has started: torch's ``init_process_group`` has no barrier
    (``TORCH_DIST_INIT_BARRIER`` is 0), so a rank whose gloo mesh is connected could end the
    group (``finalize``, its process's end) while a peer still waits for that rank's reply in its
    own ``connectFullMesh``, which then fails with "Connection closed by peer" (seen once in about
    twenty two-rank ``ur.launch`` calls of a function that returns at once)."""
    _join(base, "started", env, timeout)


#: how long the end at exit waits for the flight recorder to mark the last collective completed
_SETTLE_AT_EXIT = 1.0


def _end_group_at_exit() -> None:
    """At the interpreter's exit, end the group :func:`init` started where the program did not
    and none of its collectives is in flight: torch 2.13's teardown of a gloo group left alive
    aborts the process ("terminate called without an active exception", SIGABRT after the
    program's last line: 33 of 60 two-rank torchrun runs of a program without
    ``destroy_process_group`` here), and the launcher counts that rank as failed. A group with
    a collective in flight, or whose state cannot be read, is left to torch: ending it would
    wait for its peers (15 s for a peer that stayed 15 s)."""
    from unirank.hang.waits import in_flight, recorder_status

    if not state.STATE.owns_group:
        return
    settled = time.monotonic() + _SETTLE_AT_EXIT
    while True:  # the recorder marks a collective completed just after its caller returns
        status = recorder_status(exact=True)
        if status is None:
            return
        if not in_flight(status)[0]:
            break
        if time.monotonic() >= settled:
            return
        time.sleep(0.01)
    with contextlib.suppress(Exception):
        finalize()


def init(
    backend: str | None = None, init_timeout: float | None = None,
    init_method: str | None = None, *, hang_report_after: str | float | None = None,
    hang_timeout: str | float | None = None, timeout: float | None = None,
    on_hang: str | None = None,
) -> None:
    """Start the default process group for this process's launcher context.

    ``backend``: ``None`` or ``"auto"`` (horovod under horovodrun, else nccl with a GPU per
    local rank, else gloo), or a name: ``"gloo"``, ``"nccl"``, ``"horovod"``, ``"xla-tpu"``
    (alias ``"xla"``), or another torch.distributed backend.
    ``init_timeout``: seconds (or a ``timedelta``) to wait for every rank to join (default
    ``UNIRANK_INIT_TIMEOUT``, else 300); when given, it is also the process group's collective
    timeout (else torch's default). ``timeout=`` is accepted for it (ignite's word); an error
    about the value names the keyword given.
    ``init_method``: ``None`` or ``"env://"`` (unirank's rendezvous store on the master address
    and port), or ``"file://PATH"`` (a store in that file, seen by every rank; no master address
    needed); see :func:`unirank.runtime.ignite_options.init_method`.
    ``hang_report_after``, ``hang_timeout``: the hang detector's ``--hang-report-after`` and
    ``--hang-timeout`` (seconds, or ``"off"``), over UNIRANK_HANG_REPORT_AFTER and
    UNIRANK_HANG_TIMEOUT (see docs/troubleshooting.md). ``on_hang``: ``--on-hang``, what
    ``unirank run`` does once ``hang_timeout`` ended the workers: ``"exit"``, ``"restart"`` or
    ``"evict"`` (an elastic job only), over ``--on-hang`` and UNIRANK_ON_HANG
    (:func:`ask_on_hang`; see docs/run.md).

    A group that already exists (the user called ``init_process_group``, or Ray Train's
    ``TorchTrainer`` did before the function) is adopted as it is, and the hang watcher is
    started for it (:func:`_adopt`).
    At world size 1 no network is used (an in-memory store). Ranks that do not join in time are
    named in the :class:`~unirank.joincheck.InitTimeoutError` every waiting rank raises.

    Reads: the launcher's variables (see :func:`unirank.launchers.detect`),
    UNIRANK_INIT_TIMEOUT, UNIRANK_HANG_REPORT_AFTER, UNIRANK_HANG_TIMEOUT, UNIRANK_HANG_INTERVAL,
    UNIRANK_ELASTIC, UNIRANK_ATTEMPT_DIR, TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT,
    SLURM_GPUS_PER_TASK, SLURMD_TRES_BIND, SLURMD_NODENAME, CUDA_VISIBLE_DEVICES (through torch).
    """
    if state.is_initialized():
        _adopt(*ignite_options.init_timeout_given(init_timeout, timeout), hang_report_after,
               hang_timeout, on_hang)
        return
    file_url = ignite_options.init_method(init_method)
    environ = os.environ
    ask_on_hang(on_hang, environ)
    env = state.dist_env()
    require_launched(env, sys.argv, sys.executable)
    given, keyword = ignite_options.init_timeout_given(init_timeout, timeout)
    seconds = resolve_init_timeout(given, environ, keyword)
    hang = hang_settings(hang_report_after, hang_timeout, environ)
    facts = backends.cuda_facts()
    entry = backends.get(
        backends.choose_backend(
            backend,
            facts,
            local_world_size=env.local_world_size,
            per_task_gpus=gpus_bound_per_task(environ),
            launcher=env.launcher,
        )
    )
    device_name = entry.device(env.local_rank, facts)
    if not state.STATE.ends_at_exit:  # before the hang watcher's: it runs after it (LIFO)
        atexit.register(_end_group_at_exit)
        state.STATE.ends_at_exit = True
    generation = state.STATE.generation
    state.STATE.generation += 1
    if env.world_size == 1:
        base: Any = dist.HashStore()  # type: ignore[attr-defined]
    elif not entry.uses_store(environ):
        base = None
    elif file_url is not None:
        base = _file_store(env, file_url, seconds, generation)
    else:
        base = _joined_store(env, seconds, generation)
        _watch_hangs(env, seconds, environ, hang)
    entry.init(
        rank=env.rank,
        world_size=env.world_size,
        store=base,
        timeout=None if given is None else seconds,
        device=device_name,
    )
    if base is not None and env.world_size > 1:
        _all_started(base, env, seconds)
    from unirank.hang.recorder import recorder_started

    recorder_started()  # torch has read the flight recorder's size
    if entry.collectives is not None:
        state.STATE.active = entry
    state.STATE.owns_group = True
    if base is not None:
        state.STATE.stores.append(base)


def finalize() -> None:
    """End the process group (or Horovod/XLA backend) unirank started, through its backend's
    entry (a group the user created is left alone), once a snapshot on its way
    (:func:`unirank.save_state`) is kept."""
    entry = state.backend_entry()
    BACKGROUND.join()  # a save's thread (ur.save_state) ends first; none: at once
    try:
        if state.STATE.owns_group and entry is not None:
            release_bound_world()  # else the group outlives its end (.boundworld)
            entry.finalize()
    finally:
        state.STATE.active = None
        state.STATE.owns_group = False
        state.STATE.stores.clear()
