"""The first code a ``unirank run`` worker runs: ``python -m unirank.supervisor.bootstrap``.

Usage: ``python -m unirank.supervisor.bootstrap TARGET`` where TARGET is ``SCRIPT [ARGS...]``,
``-m MODULE [ARGS...]``, ``--exec PROGRAM [ARGS...]`` (``unirank run --no-python``) or
``--call FILE`` (a function that :class:`~unirank.runtime.parallel.Parallel` pickled).

In order, it

1. arms the parent-death signal (SIGKILL when the supervisor dies), and exits at once if the
   supervisor is already gone;
2. on rank 0, builds the TCPStore server on the listening socket the supervisor opened
   (``master_listen_fd``). Every rank, rank 0 included, is a store client
   (TORCHELASTIC_USE_AGENT_STORE=True), as under torchrun. So that the store outlives every
   rank's use of it, rank 0 does not end before its node's other workers' programs: at the end
   of its program it waits until the supervisor closes the linger pipe (UNIRANK_LINGER_FD),
   which it does once every other worker closed its done pipe (UNIRANK_DONE_FD, closed when
   the program ends, before the interpreter's slow teardown) or ended. With
   ``--exec`` it forks a store host instead, which serves until the supervisor ends;
3. announces itself and waits until every rank has joined (:mod:`unirank.joincheck`), failing
   within the init timeout with the missing ranks named (not with ``--exec``: the program is
   not Python, and only rank 0 waits for torch, to host the store);
4. removes its private variables from the environment and runs the target as ``python SCRIPT``
   would (``__main__``, ``sys.argv``, ``__file__``, ``sys.path[0]``), as ``python -m MODULE``
   would, by ``exec`` of the program, or calls the function after :func:`unirank.init`;
5. when ranks run under other supervisors too (several nodes, or one ``unirank run`` per task),
   counts itself out in the store when the program ends, and rank 0 waits (at most
   UNIRANK_EXIT_TIMEOUT seconds) until every rank has, so that the store stays up while others
   still use it (torchrun's agents have the same exit barrier).

Reads: UNIRANK_SUPERVISOR_PID, UNIRANK_STORE_FD, UNIRANK_NODE_NAME, UNIRANK_NODE_NAMES,
UNIRANK_INIT_TIMEOUT, UNIRANK_EXIT_TIMEOUT, UNIRANK_LINGER_FD, UNIRANK_DONE_FD, RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT.
"""

from __future__ import annotations

import os
import signal
import sys

if __name__ == "__main__":  # arm the parent-death signal before anything slow
    ENTERED_AT = __import__("time").time()  # the timeline's "bootstrap entered"
    _SUPERVISOR = os.environ.get("UNIRANK_SUPERVISOR_PID")
    if _SUPERVISOR and _SUPERVISOR.isdigit():
        from unirank.supervisor.pdeathsig import die_with_parent

        die_with_parent(int(_SUPERVISOR), signal.SIGKILL)

import contextlib
import functools
import pickle
import runpy
import select
import socket
import time
import types
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from unirank.contract import (
    DONE_FD_VAR,
    EXIT_TIMEOUT_VAR,
    LINGER_FD_VAR,
    NODE_NAME_VAR,
    NODE_NAMES_VAR,
    PRIVATE_VARIABLES,
    STORE_FD_VAR,
    SUPERVISOR_PID_VAR,
    TIMELINE_FILE_VAR,
    TIMELINE_VAR,
    parse_seconds,
    resolve_init_timeout,
)
from unirank.errorfile import record_exception
from unirank.errors import ConfigError

__all__ = ["WorkerInfo", "main", "read_worker_info", "rendezvous", "run_target"]

#: exit code of a worker that could not rendezvous (store unreachable, init timeout)
RENDEZVOUS_FAILED = 1
#: store keys of the exit barrier (several nodes only)
EXIT_COUNT_KEY = "unirank/exit/count"
EXIT_ALL_KEY = "unirank/exit/all"
_USAGE = ("usage: python -m unirank.supervisor.bootstrap (SCRIPT | -m MODULE | --exec PROGRAM | "
          "--call FILE) [ARGS...]")


@dataclass(frozen=True)
class WorkerInfo:
    """What the bootstrap needs to know about its worker, read from the environment."""

    rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    node_name: str
    #: the nodes in node-rank order, as a compressed host list (expanded only to name a node)
    node_names: str
    init_timeout: float
    store_fd: int | None
    supervisor_pid: int | None = None
    exit_timeout: float | None = None
    linger_fd: int | None = None
    done_fd: int | None = None

    def node_of(self, rank: int) -> str:
        """The node that runs ``rank``: its host name where known, else its node rank."""
        node = rank // max(1, self.local_world_size)
        if node == self.node_rank and self.node_name:
            return self.node_name
        names = _expand_names(self.node_names)
        if 0 <= node < len(names):
            return names[node]
        return f"node rank {node}"


def _int(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = environ.get(name)
    if text is None or not text.strip():
        if default is None:
            raise SystemExit(f"unirank bootstrap: {name} is not set; start workers with "
                             "unirank run")
        return default
    try:
        return int(text)
    except ValueError:
        raise SystemExit(f"unirank bootstrap: {name}={text!r} is not an integer") from None


@functools.lru_cache(maxsize=1)
def _expand_names(hostlist: str) -> tuple[str, ...]:
    """The node names of a compressed host list (on the failure path only)."""
    from unirank.hostlist import expand

    try:
        return tuple(expand(hostlist)) if hostlist else ()
    except ConfigError:
        return ()


def read_worker_info(environ: Mapping[str, str]) -> WorkerInfo:
    """The worker's place and rendezvous settings.

    Reads: RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
    UNIRANK_NODE_NAME, UNIRANK_NODE_NAMES, UNIRANK_INIT_TIMEOUT, UNIRANK_STORE_FD,
    UNIRANK_SUPERVISOR_PID, UNIRANK_EXIT_TIMEOUT, UNIRANK_LINGER_FD, UNIRANK_DONE_FD.
    """
    try:
        init_timeout = resolve_init_timeout(None, environ)
        exit_text = environ.get(EXIT_TIMEOUT_VAR, "")
        exit_timeout = parse_seconds(exit_text, EXIT_TIMEOUT_VAR) if exit_text else None
    except ConfigError as exc:
        raise SystemExit(f"unirank bootstrap: {exc}") from None
    names = environ.get(NODE_NAMES_VAR, "")
    fd_text = environ.get(STORE_FD_VAR, "")
    pid_text = environ.get(SUPERVISOR_PID_VAR, "")
    linger_text = environ.get(LINGER_FD_VAR, "")
    done_text = environ.get(DONE_FD_VAR, "")
    return WorkerInfo(
        rank=_int(environ, "RANK"),
        world_size=_int(environ, "WORLD_SIZE"),
        local_world_size=_int(environ, "LOCAL_WORLD_SIZE", 1),
        node_rank=_int(environ, "GROUP_RANK", 0),
        master_addr=environ.get("MASTER_ADDR") or "127.0.0.1",
        master_port=_int(environ, "MASTER_PORT"),
        node_name=environ.get(NODE_NAME_VAR) or socket.gethostname(),
        node_names=names,
        init_timeout=init_timeout,
        store_fd=int(fd_text) if fd_text.isdigit() else None,
        supervisor_pid=int(pid_text) if pid_text.isdigit() else None,
        exit_timeout=exit_timeout,
        linger_fd=int(linger_text) if linger_text.isdigit() else None,
        done_fd=int(done_text) if done_text.isdigit() else None,
    )


def _fail(info: WorkerInfo, message: str) -> NoReturn:
    print(f"unirank: rank {info.rank}: {message}", file=sys.stderr, flush=True)
    raise SystemExit(RENDEZVOUS_FAILED)


def _serve_store(info: WorkerInfo, watched: int) -> NoReturn:
    """The store host (a forked child of rank 0): serve the store until ``watched`` (the
    supervisor) is gone. The supervisor kills it with rank 0's process group at its end."""
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1,
                    signal.SIGUSR2):
            signal.signal(sig, signal.SIG_IGN)  # forwarded signals are for the program
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        from datetime import timedelta

        from torch.distributed import TCPStore  # type: ignore[attr-defined]

        assert info.store_fd is not None
        server = TCPStore(
            info.master_addr, info.master_port, None, True,
            timedelta(seconds=info.init_timeout), wait_for_workers=False,
            master_listen_fd=info.store_fd, use_libuv=True,
        )  # the server owns the listening fd now: never close it here
        try:
            pidfd = os.pidfd_open(watched)
        except (OSError, AttributeError):  # pragma: no cover - Linux < 5.3
            while True:
                signal.pause()
        if os.getppid() == watched or _alive(watched):
            select.select([pidfd], [], [])
        del server
    finally:
        os._exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - someone else's pid
        return True
    return True


def host_store(info: WorkerInfo) -> None:
    """Fork the store host on the listening socket the supervisor passed (rank 0 with
    ``--exec``, whose program replaces this process). Not used otherwise: after a fork, both
    processes pay for copying every page Python touches (measured: 60 ms a run)."""
    import torch.distributed  # noqa: F401  (imported before the fork, once)

    assert info.store_fd is not None
    watched = info.supervisor_pid or os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        _serve_store(info, watched)
    os.close(info.store_fd)


def rendezvous(info: WorkerInfo) -> Any:
    """Host the store (rank 0) or connect to it, then wait for every rank to join.

    Returns this rank's store (the server itself on rank 0: keep it alive). On failure prints a
    one-line message and raises SystemExit(1).
    """
    from datetime import timedelta

    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    from unirank.joincheck import InitTimeoutError, announce_and_wait

    deadline = time.monotonic() + info.init_timeout
    try:
        store = TCPStore(
            info.master_addr, info.master_port, None, info.store_fd is not None,
            timedelta(seconds=info.init_timeout), wait_for_workers=False,
            master_listen_fd=info.store_fd, use_libuv=True,
        )
    except (RuntimeError, TimeoutError) as exc:
        detail = " ".join(str(exc).split())[:200]
        _fail(info, f"could not reach the rendezvous store of rank 0 at "
              f"{info.master_addr}:{info.master_port} within {info.init_timeout:g} s "
              f"(init timeout). Check that node 0 ({info.node_of(0)}) started unirank run "
              f"with the same --master-port, and that this node can reach that address "
              f"({type(exc).__name__}: {detail})")
    try:
        announce_and_wait(
            store, rank=info.rank, world_size=info.world_size, node_name=info.node_name,
            timeout=max(0.0, deadline - time.monotonic()), rank_to_node=info.node_of,
        )
    except InitTimeoutError as exc:
        _fail(info, str(exc).removeprefix(f"rank {info.rank}: "))
    except (RuntimeError, OSError) as exc:
        detail = " ".join(str(exc).split())[:200]
        _fail(info, f"lost the rendezvous store at {info.master_addr}:{info.master_port} "
              f"(rank 0's node {info.node_of(0)}) while waiting for the other ranks: {detail}")
    return store


def _private_fds(info: WorkerInfo) -> None:
    """The supervisor's pipes are not for the program's own children (exec'd or spawned)."""
    for fd in (info.linger_fd, info.done_fd):
        if fd is not None:
            with contextlib.suppress(OSError):
                os.set_inheritable(fd, False)


def done(info: WorkerInfo) -> None:
    """Tell the supervisor this worker's program ended (close the done pipe)."""
    if info.done_fd is not None:
        with contextlib.suppress(OSError):
            os.close(info.done_fd)


def linger(info: WorkerInfo) -> None:
    """Rank 0 at the end of its program: wait until the supervisor closed the linger pipe (its
    node's other workers have ended, or it is gone), so the store this process serves outlives
    their use of it."""
    if info.linger_fd is None:
        return
    with contextlib.suppress(OSError):
        while os.read(info.linger_fd, 4096):
            pass


def exit_barrier(store: Any, info: WorkerInfo, *, wait: bool) -> None:
    """Count this rank out; with ``wait`` (rank 0, whose node hosts the store), wait until
    every rank has, at most ``info.exit_timeout`` seconds. Never raises."""
    from datetime import timedelta

    with contextlib.suppress(Exception):
        if int(store.add(EXIT_COUNT_KEY, 1)) >= info.world_size:
            store.set(EXIT_ALL_KEY, "1")
        if wait and info.exit_timeout:
            store.wait([EXIT_ALL_KEY], timedelta(seconds=info.exit_timeout))


def _hidden(filename: str) -> bool:
    """True for the frames of this bootstrap and of runpy, which ``python script.py`` lacks."""
    if filename.startswith("<frozen runpy"):
        return True
    path = os.path.abspath(filename)
    return path == _THIS_FILE or os.path.basename(path) == "runpy.py"


_THIS_FILE = os.path.abspath(__file__)


def _trimmed_excepthook(
    hook: Callable[[type[BaseException], BaseException, types.TracebackType | None], Any],
) -> Callable[[type[BaseException], BaseException, types.TracebackType | None], Any]:
    """An excepthook that drops the bootstrap's and runpy's frames, as ``python script.py``."""

    def excepthook(
        kind: type[BaseException], value: BaseException, tb: types.TracebackType | None
    ) -> Any:
        while tb is not None and _hidden(tb.tb_frame.f_code.co_filename):
            tb = tb.tb_next
        if isinstance(value, BaseException):
            value = value.with_traceback(tb)  # the default hook prints value.__traceback__
            record_exception(value)
        return hook(kind, value, tb)

    return excepthook


def call_function(path: str) -> None:
    """Run the function that :class:`~unirank.runtime.parallel.Parallel` pickled to ``path``:
    set up ``sys.path`` and ``__main__`` as the parent had them (multiprocessing's ``spawn``
    preparation), start the process group, call ``fn(local_rank, *args, **kwargs)``, end it."""
    import multiprocessing.spawn

    with open(path, "rb") as fh:
        preparation, payload = pickle.load(fh)
    multiprocessing.spawn.prepare(preparation)
    fn, args, kwargs, backend, init_timeout = pickle.loads(payload)

    from unirank.runtime import lifecycle, state

    lifecycle.init(backend, init_timeout)
    try:
        fn(state.get_local_rank(), *args, **kwargs)
    except BaseException as exc:
        record_exception(exc)  # now, before the group goes away and the peers fail too
        raise
    lifecycle.finalize()


def run_target(argv: Sequence[str]) -> None:
    """Run ``SCRIPT ARGS...``, ``-m MODULE ARGS...``, ``--exec PROGRAM ARGS...`` or
    ``--call FILE`` (see the module docstring)."""
    if not argv or (argv[0] in ("-m", "--exec", "--call") and len(argv) < 2):
        raise SystemExit(_USAGE)
    sys.excepthook = _trimmed_excepthook(sys.excepthook)
    if argv[0] == "--exec":
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execvp(argv[1], list(argv[1:]))
        except OSError as exc:
            raise SystemExit(f"unirank: cannot run {argv[1]!r} (--no-python): "
                             f"{exc.strerror or exc}") from None
    if argv[0] == "--call":
        call_function(argv[1])
        return
    if argv[0] == "-m":
        module = argv[1]
        sys.argv = [module, *argv[2:]]  # runpy replaces argv[0] with the module's file
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    script = argv[0]
    sys.argv = [script, *argv[1:]]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


def _scrub(environ: MutableMapping[str, str]) -> None:
    for name in PRIVATE_VARIABLES:
        environ.pop(name, None)


def _recorder(info: WorkerInfo) -> Any:
    """The timeline's recorder when ``--timeline`` is on (UNIRANK_TIMELINE), else None."""
    started = _TIMELINE_START
    if not started:
        return None
    from unirank.supervisor.timeline import Recorder

    try:
        recorder = Recorder(info.rank, info.node_name, float(started))
    except ValueError:
        return None
    recorder.times["bootstrap"] = float(globals().get("ENTERED_AT", time.time()))
    import torch.distributed  # noqa: F401  (what rendezvous imports first)

    recorder.mark("torch")
    return recorder


_TIMELINE_START = ""


def main(argv: Sequence[str] | None = None) -> None:
    """Rendezvous, then run the user's program (see the module docstring)."""
    global _TIMELINE_START
    args = list(sys.argv[1:] if argv is None else argv)
    _TIMELINE_START = os.environ.get(TIMELINE_VAR, "")
    timeline_file = os.environ.get(TIMELINE_FILE_VAR, "")
    info = read_worker_info(os.environ)
    _scrub(os.environ)
    _private_fds(info)
    if args and args[0] == "--exec":
        if info.store_fd is not None:
            host_store(info)
        run_target(args)
        return
    recorder = _recorder(info)
    store = rendezvous(info)
    if recorder is not None:
        recorder.mark("joined")
        recorder.install_hooks()
        recorder.mark("script")
    ok = False
    try:
        run_target(args)
        ok = True
    except SystemExit as exc:
        ok = exc.code in (None, 0)
        raise
    finally:
        if recorder is not None:
            recorder.publish(store)
        done(info)
        if info.exit_timeout is not None:
            exit_barrier(store, info, wait=ok and info.rank == 0)
        if ok:
            linger(info)
            if recorder is not None and timeline_file:
                from unirank.supervisor.timeline import gather

                gather(store, info.world_size, timeline_file)
        del store  # a server lives exactly as long as the program and its linger


if __name__ == "__main__":
    main()
