"""The first code a ``unirank run`` worker runs: ``python -m unirank.supervisor.bootstrap``.

Usage: ``python -m unirank.supervisor.bootstrap SCRIPT [ARGS...]`` or
``python -m unirank.supervisor.bootstrap -m MODULE [ARGS...]``.

In order, it

1. arms the parent-death signal (SIGKILL when the supervisor dies), and exits at once if the
   supervisor is already gone;
2. on rank 0 of node 0, builds the TCPStore server on the listening socket the supervisor opened
   (``master_listen_fd``) and keeps it for the life of the process; every rank, rank 0 included,
   is then a store client (TORCHELASTIC_USE_AGENT_STORE=True), as under torchrun;
3. announces itself and waits until every rank has joined (:mod:`unirank.joincheck`), failing
   within the init timeout with the missing ranks named;
4. removes its private variables from the environment and runs the script as ``python SCRIPT``
   would (``__main__``, ``sys.argv``, ``__file__``, ``sys.path[0]``), or the module as
   ``python -m MODULE`` would.

Reads: UNIRANK_SUPERVISOR_PID, UNIRANK_STORE_FD, UNIRANK_NODE_NAME, UNIRANK_NODE_NAMES,
UNIRANK_INIT_TIMEOUT, RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT.
"""

from __future__ import annotations

import os
import signal
import sys

if __name__ == "__main__":  # arm the parent-death signal before anything slow
    _SUPERVISOR = os.environ.get("UNIRANK_SUPERVISOR_PID")
    if _SUPERVISOR and _SUPERVISOR.isdigit():
        from unirank.supervisor.pdeathsig import die_with_parent

        die_with_parent(int(_SUPERVISOR), signal.SIGKILL)

import runpy
import socket
import time
import types
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from unirank.errorfile import record_exception

__all__ = ["WorkerInfo", "main", "read_worker_info", "rendezvous", "run_target"]

#: exit code of a worker that could not rendezvous (store unreachable, init timeout)
RENDEZVOUS_FAILED = 1

_PRIVATE = ("UNIRANK_SUPERVISOR_PID", "UNIRANK_STORE_FD", "UNIRANK_NODE_NAME",
            "UNIRANK_NODE_NAMES")


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
    node_names: tuple[str, ...]
    init_timeout: float
    store_fd: int | None

    def node_of(self, rank: int) -> str:
        """The node that runs ``rank``: its host name where known, else its node rank."""
        node = rank // max(1, self.local_world_size)
        if node == self.node_rank and self.node_name:
            return self.node_name
        if 0 <= node < len(self.node_names):
            return self.node_names[node]
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


def read_worker_info(environ: Mapping[str, str]) -> WorkerInfo:
    """The worker's place and rendezvous settings.

    Reads: RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
    UNIRANK_NODE_NAME, UNIRANK_NODE_NAMES, UNIRANK_INIT_TIMEOUT, UNIRANK_STORE_FD.
    """
    timeout_text = environ.get("UNIRANK_INIT_TIMEOUT", "")
    try:
        init_timeout = float(timeout_text) if timeout_text.strip() else 300.0
    except ValueError:
        init_timeout = 300.0
    names = environ.get("UNIRANK_NODE_NAMES", "")
    fd_text = environ.get("UNIRANK_STORE_FD", "")
    return WorkerInfo(
        rank=_int(environ, "RANK"),
        world_size=_int(environ, "WORLD_SIZE"),
        local_world_size=_int(environ, "LOCAL_WORLD_SIZE", 1),
        node_rank=_int(environ, "GROUP_RANK", 0),
        master_addr=environ.get("MASTER_ADDR") or "127.0.0.1",
        master_port=_int(environ, "MASTER_PORT"),
        node_name=environ.get("UNIRANK_NODE_NAME") or socket.gethostname(),
        node_names=tuple(n for n in names.split(",") if n),
        init_timeout=init_timeout,
        store_fd=int(fd_text) if fd_text.isdigit() else None,
    )


def _fail(info: WorkerInfo, message: str) -> NoReturn:
    print(f"unirank: rank {info.rank}: {message}", file=sys.stderr, flush=True)
    raise SystemExit(RENDEZVOUS_FAILED)


def rendezvous(info: WorkerInfo) -> Any:
    """Host the store (node 0, rank 0) or connect to it, then wait for every rank to join.

    Returns the server store on the hosting rank (keep it alive), else None. On failure prints a
    one-line message and raises SystemExit(1).
    """
    from datetime import timedelta

    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    from unirank.joincheck import InitTimeoutError, announce_and_wait

    deadline = time.monotonic() + info.init_timeout
    server: Any = None
    if info.store_fd is not None:
        server = TCPStore(
            info.master_addr, info.master_port, None, True,
            timedelta(seconds=info.init_timeout), wait_for_workers=False,
            master_listen_fd=info.store_fd, use_libuv=True,
        )
        store = server
    else:
        try:
            store = TCPStore(
                info.master_addr, info.master_port, None, False,
                timedelta(seconds=info.init_timeout), wait_for_workers=False,
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
    return server


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


def run_target(argv: Sequence[str]) -> None:
    """Run ``SCRIPT ARGS...`` or ``-m MODULE ARGS...`` as the ``__main__`` module."""
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        raise SystemExit("usage: python -m unirank.supervisor.bootstrap (SCRIPT | -m MODULE) "
                         "[ARGS...]")
    sys.excepthook = _trimmed_excepthook(sys.excepthook)
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
    for name in _PRIVATE:
        environ.pop(name, None)


def main(argv: Sequence[str] | None = None) -> None:
    """Rendezvous, then run the user's program (see the module docstring)."""
    args = list(sys.argv[1:] if argv is None else argv)
    info = read_worker_info(os.environ)
    _scrub(os.environ)
    server = rendezvous(info)
    try:
        run_target(args)
    finally:
        del server  # the store server lives exactly as long as the user's program


if __name__ == "__main__":
    main()
