"""Local worker processes for :class:`~unirank.runtime.parallel.Parallel`.

The parent hosts the rendezvous store (node rank 0 only) *before* starting its workers, so no
worker ever waits on a store that is not listening yet. Workers are started with
multiprocessing's ``spawn`` method and torchrun's environment, die with the parent
(``PR_SET_PDEATHSIG``), and are waited on without polling (``multiprocessing.connection.wait``
on their sentinels). When one fails, the others get SIGTERM, then SIGKILL after a grace period,
and the parent raises :class:`WorkerFailedError` naming the failed local rank and exit code.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from unirank.distenv import DistEnv
from unirank.errors import ConfigError

__all__ = [
    "TERMINATE_GRACE_S",
    "WorkerFailedError",
    "WorkerSpec",
    "die_with_parent",
    "host_store",
    "run_workers",
    "worker_environ",
]

#: seconds between SIGTERM and SIGKILL when the other workers are stopped
TERMINATE_GRACE_S = 5.0
_PR_SET_PDEATHSIG = 1
_TRACEBACK_TAIL = 4000


class WorkerFailedError(RuntimeError):
    """A local worker exited with a non-zero code (or was killed by a signal)."""

    def __init__(self, local_rank: int, rank: int, exitcode: int, traceback_tail: str = "") -> None:
        self.local_rank = local_rank
        self.rank = rank
        self.exitcode = exitcode
        self.traceback_tail = traceback_tail
        if exitcode < 0:
            try:
                how = f"was killed by signal {signal.Signals(-exitcode).name}"
            except ValueError:
                how = f"was killed by signal {-exitcode}"
        else:
            how = f"exited with code {exitcode}"
        message = f"local rank {local_rank} (rank {rank}) {how}"
        last = [line for line in traceback_tail.strip().splitlines() if line.strip()]
        if last:
            message += f": {last[-1].strip()}"
        super().__init__(message)


@dataclass(frozen=True)
class WorkerSpec:
    """Everything one worker needs: its DistEnv, its environment and how to init."""

    env: DistEnv
    environ: Mapping[str, str]
    backend: str | None
    init_timeout: float | None
    parent_pid: int


def worker_environ(env: DistEnv, base: Mapping[str, str]) -> dict[str, str]:
    """The variables a worker gets on top of ``base``: torchrun's contract for ``env``.

    Reads (from ``base``): OMP_NUM_THREADS (kept when set, else 1 as torchrun does).
    """
    extra = env.torchrun_environ()
    extra.update(
        {
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": env.job_id or "unirank-parallel",
        }
    )
    if "OMP_NUM_THREADS" not in base:
        extra["OMP_NUM_THREADS"] = "1"
    return extra


def host_store(addr: str, port: int, *, port_fixed: bool, timeout: float) -> tuple[Any, int]:
    """Serve the rendezvous TCPStore on ``port``; returns ``(store, port)``.

    When ``port`` is busy and not ``port_fixed``, a free port is taken instead; a busy fixed
    port is a ConfigError naming MASTER_PORT.
    """
    import torch.distributed as dist

    def serve(on: int) -> Any:
        return dist.TCPStore(  # type: ignore[attr-defined]
            addr, on, None, True, timedelta(seconds=timeout), wait_for_workers=False
        )

    try:
        store = serve(port)
    except RuntimeError as exc:
        if port_fixed:
            raise ConfigError(
                f"cannot be served on this host ({str(exc).splitlines()[0]})",
                variable="MASTER_PORT",
                value=str(port),
                hint="pick a free port (master_port=..., or export MASTER_PORT=...)",
            ) from None
        store = serve(0)
    return store, int(store.port)


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies; exit now if it already has."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def _report(conn: multiprocessing.connection.Connection, text: str) -> None:
    """Tell the parent this worker is failing, with when (monotonic clock) and why."""
    with contextlib.suppress(Exception):
        conn.send((time.monotonic(), text[-_TRACEBACK_TAIL:]))


def _worker_main(
    spec: WorkerSpec,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    conn: multiprocessing.connection.Connection,
) -> None:
    """Entry point of a spawned worker: init, ``fn(local_rank, ...)``, finalize.

    A failure is reported to the parent before the process group goes away, so that the parent
    can tell the first failure from the ranks that failed because of it.
    """
    die_with_parent(spec.parent_pid)
    from unirank.runtime import lifecycle, state

    state.set_dist_env(spec.env)
    try:
        lifecycle.init(spec.backend, spec.init_timeout)
        fn(spec.env.local_rank, *args, **kwargs)
        lifecycle.finalize()
    except SystemExit as exc:
        if exc.code not in (None, 0):
            _report(conn, f"SystemExit: {exc.code}")
        raise
    except BaseException:
        _report(conn, traceback.format_exc())
        raise
    finally:
        conn.close()


@contextlib.contextmanager
def _environ_patched(extra: Mapping[str, str]) -> Iterator[None]:
    """Set ``extra`` in os.environ for the duration (children started meanwhile inherit it)."""
    saved = {name: os.environ.get(name) for name in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _stop(procs: Sequence[Any], grace: float) -> None:
    """SIGTERM every live process, SIGKILL those still alive after ``grace`` seconds; reap all."""
    live = [p for p in procs if p.exitcode is None]
    for proc in live:
        with contextlib.suppress(OSError):
            proc.terminate()
    deadline = time.monotonic() + grace
    while live:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        multiprocessing.connection.wait([p.sentinel for p in live], timeout=remaining)
        live = [p for p in live if p.exitcode is None]
    for proc in live:
        with contextlib.suppress(OSError):
            proc.kill()
    for proc in procs:
        proc.join()


@dataclass
class _Failure:
    index: int
    when: float
    tail: str = ""


def _add(failures: list[_Failure], new: _Failure) -> list[_Failure]:
    """``failures`` with ``new`` in it: a worker's own report replaces what was guessed."""
    same = [f for f in failures if f.index == new.index]
    if same and not new.tail:
        return failures
    return [*(f for f in failures if f.index != new.index), new]


def _receive(conn: multiprocessing.connection.Connection) -> tuple[float, str] | None:
    """A failure report from a worker's pipe, or None (the worker closed it without one)."""
    with contextlib.suppress(EOFError, OSError):
        if conn.poll():
            when, text = conn.recv()
            return float(when), str(text)
    return None


def _wait_first_failure(
    procs: Sequence[Any], conns: Sequence[multiprocessing.connection.Connection]
) -> list[_Failure]:
    """Wait until every worker exited cleanly ([]) or one failed (its failure, and any other
    seen at the same moment)."""
    sentinels = {proc.sentinel: index for index, proc in enumerate(procs)}
    readers = {id(conn): index for index, conn in enumerate(conns)}
    failures: list[_Failure] = []
    while sentinels and not failures:
        watched: list[Any] = [*sentinels, *(conns[i] for i in readers.values())]
        for ready in multiprocessing.connection.wait(watched):
            if isinstance(ready, int):
                index = sentinels.pop(ready)
                procs[index].join()
                if procs[index].exitcode != 0:
                    failures = _add(failures, _Failure(index, time.monotonic()))
                continue
            index = readers.pop(id(ready))
            report = _receive(conns[index])
            if report is not None:
                failures = _add(failures, _Failure(index, *report))
    return failures


def _first_failure(
    failures: list[_Failure],
    specs: Sequence[WorkerSpec],
    procs: Sequence[Any],
    conns: Sequence[multiprocessing.connection.Connection],
    grace: float,
) -> WorkerFailedError:
    """Stop every worker and name the failure that came first."""
    # the failing workers are exiting on their own: let them, so their exit code is theirs
    exiting = [procs[f.index] for f in failures if procs[f.index].exitcode is None]
    if exiting:
        multiprocessing.connection.wait([p.sentinel for p in exiting], timeout=grace)
    _stop(procs, grace)
    for index, conn in enumerate(conns):
        report = _receive(conn)
        if report is not None:
            failures = _add(failures, _Failure(index, *report))
    first = min(failures, key=lambda f: f.when)
    env = specs[first.index].env
    return WorkerFailedError(env.local_rank, env.rank, int(procs[first.index].exitcode), first.tail)


def run_workers(
    specs: Sequence[WorkerSpec],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    grace: float = TERMINATE_GRACE_S,
) -> None:
    """Start one spawned worker per spec and wait for all; raise on the first failure.

    ``fn`` (and its arguments) must be picklable: a module-level function of an importable
    module (in a script, under ``if __name__ == "__main__":``).
    """
    ctx = multiprocessing.get_context("spawn")
    procs: list[Any] = []
    conns: list[multiprocessing.connection.Connection] = []
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        for spec in specs:
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_worker_main,
                args=(spec, fn, args, kwargs, writer),
                name=f"unirank-worker-{spec.env.local_rank}",
            )
            with _environ_patched(spec.environ):
                proc.start()
            writer.close()
            procs.append(proc)
            conns.append(reader)
        failures = _wait_first_failure(procs, conns)
        if failures:
            raise _first_failure(failures, specs, procs, conns, grace)
    except BaseException:
        _stop(procs, grace)
        raise
    finally:
        for conn in conns:
            conn.close()
