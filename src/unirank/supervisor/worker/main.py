"""The worker bootstrap's sequence, after :mod:`.bootstrap` (a worker
started as its own interpreter) or :mod:`..fork.child` (a worker forked from the
fork server) armed the parent-death signal:

1. read the worker's settings and wiring (:mod:`.info`), have faulthandler write a fatal
   signal's stack to the attempt folder (:mod:`.faults`), then remove the private
   variables from the environment and keep the supervisor's pipes from the program's children;
   show the command line and environment block of a fresh interpreter (:mod:`.cmdline`);
2. with ``--exec``: fork the store host (rank 0) and run the program (:mod:`.target`);
3. otherwise host or join the store and wait until every rank has joined (:mod:`.store`),
   hand the joined store to the runtime (:func:`unirank.store.hand_over`: the first
   :func:`unirank.init` starts its group on it without joining again, so a rank joins once per
   run), watch each start of the run's group (:mod:`.groupstart`), apply the variables the
   program sets before it imports torch (:mod:`.lateenv`), start the hang detector's thread
   (:mod:`unirank.hang.watcher`, with torch's flight recorder turned on), and run the target;
4. at its end: publish its end-of-run record (its timeline with ``--timeline``, its time in
   collectives from the hang watcher), close its done pipe, count itself out of the exit
   barrier (ranks under other supervisors too), and on rank 0 linger until the node's other
   workers are done and gather every rank's record.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import Any

from unirank.contract import PRIVATE_VARIABLES, RUN_ID_VAR
from unirank.errorfile import exit_status
from unirank.store import hand_over
from unirank.supervisor.worker import groupstart, lateenv, numabind
from unirank.supervisor.worker import store as workerstore
from unirank.supervisor.worker.cmdline import show_as_fresh
from unirank.supervisor.worker.faults import catch_faults
from unirank.supervisor.worker.info import WorkerInfo, read_worker_info
from unirank.supervisor.worker.target import run_target

__all__ = ["run_worker"]


def _scrub(environ: MutableMapping[str, str]) -> None:
    for name in PRIVATE_VARIABLES:
        environ.pop(name, None)


def _recorder(info: WorkerInfo, entered_at: float,
              preloaded: tuple[float, float] | None) -> Any:
    """The ``--timeline`` recorder (None when off), with the times before this call
    (``preloaded``: when the fork server's imports started and ended)."""
    if info.timeline_start is None:
        return None
    from unirank.supervisor.worker.timeline import Recorder

    recorder = Recorder(info.rank, info.node_name, info.timeline_start, preloaded)
    recorder.times["bootstrap"] = entered_at
    from unirank.signals import keep_off_new_threads

    with keep_off_new_threads():  # torch's import-time threads
        import torch.distributed  # noqa: F401  (what the rendezvous imports first)

    recorder.mark("torch")
    return recorder


def _end_record(recorder: Any, watcher: Any) -> dict[str, Any]:
    """This rank's end-of-run record's parts: the timeline's times, the hang watcher's time in
    collectives ({} when neither runs)."""
    parts: dict[str, Any] = {} if watcher is None else watcher.end_record()
    if recorder is not None:
        parts["times"] = recorder.times
    return parts


def _finish(store: Any, info: WorkerInfo, parts: dict[str, Any], *, ok: bool) -> None:
    """The end of the program: end-of-run record, done pipe, exit barrier, linger (see the
    docstring)."""
    if parts:
        from unirank.supervisor.worker.timeline import publish

        publish(store, info.rank, info.node_name, parts)
    workerstore.done(info)
    if info.exit_timeout is not None:
        workerstore.exit_barrier(store, info, wait=ok and info.rank == 0)
    if ok:
        workerstore.linger(info)
        if parts and info.timeline_file:
            from unirank.supervisor.worker.timeline import gather

            gather(store, info.world_size, info.timeline_file)


def _watch_hangs(info: WorkerInfo, environ: MutableMapping[str, str]) -> Any:
    """Start this rank's hang watcher (None when the detector is off), on a store connection
    of its own, measuring the rank's time in collectives (rank 0 gathers it at the end)."""
    settings = info.hang
    if settings.report_after is None:
        return None
    from unirank.hang.watcher import Watcher

    def connect() -> Any:
        return workerstore.connect(info)

    job = None
    if environ.get("LOCAL_RANK") == "0":  # this node's job file, for `unirank stacks`
        job = {"run_id": environ.get(RUN_ID_VAR, ""), "master_addr": info.master_addr,
               "master_port": info.master_port, "supervisor_pid": info.supervisor_pid}
    return Watcher(rank=info.rank, world_size=info.world_size, node=info.node_name,
                   settings=settings, connect=connect, environ=environ, job=job,
                   measure_waits=True).start()


def run_worker(argv: Sequence[str], *, entered_at: float, environ: MutableMapping[str, str],
               preloaded: tuple[float, float] | None = None) -> None:
    """Rendezvous, then run the target ``argv`` (see the module docstring); ``entered_at`` is
    when the bootstrap started, or the fork server forked this worker (the timeline's
    ``bootstrap`` phase), ``preloaded`` when that server's imports started and ended.

    ``environ`` is the worker's process environment (``os.environ``, from the bootstrap or
    the fork server's child), which the worker's private variables are removed from.

    Reads: ``environ``, as :func:`.read_worker_info` says.
    """
    info = read_worker_info(environ)
    numabind.bind_or_exit(environ, info.rank)
    if not (argv and argv[0] == "--exec"):
        catch_faults(info.fault_file)
    _scrub(environ)
    show_as_fresh(argv, environ, info.supervisor_pid)
    workerstore.private_fds(info)
    if argv and argv[0] == "--exec":
        if info.store_fd is not None:
            workerstore.host_store(info)
        run_target(argv)
        return
    recorder = _recorder(info, entered_at, preloaded)
    store = workerstore.rendezvous(info)
    hand_over(store, rank=info.rank, world_size=info.world_size, addr=info.master_addr,
              port=info.master_port)
    uninstall = groupstart.install(store, info)
    if recorder is not None:
        recorder.mark("joined")
        recorder.install_hooks()
        recorder.mark("script")
    watcher = _watch_hangs(info, environ)  # imports nothing after lateenv's watch starts
    lateenv.watch(environ, report=info.rank == 0)
    ok = False
    try:
        run_target(argv)
        ok = True
    except SystemExit as exc:
        ok = exit_status(exc.code) == 0
        raise
    finally:
        uninstall()
        if watcher is not None:
            watcher.stop()
        _finish(store, info, _end_record(recorder, watcher), ok=ok)
        del store  # a server lives exactly as long as the program and its linger
