"""The rendezvous store: the one place that opens torch's ``TCPStore``, as server or client.

Both the worker bootstrap of ``unirank run`` / ``Parallel`` (the store server on the listening
socket the supervisor opened, every rank a client) and :func:`unirank.init` (rank 0 serves unless
an agent already does) open it here, with the same flags and one error translation:

* a master host that does not resolve is a :class:`~unirank.errors.ConfigError` naming it and
  the variable it came from, before torch sees it (:func:`unirank.resolve.require_resolvable`);
  so is one that is not this host's where this process serves the store itself
  (:func:`unirank.resolve.require_own`; a listening socket was opened, and the address
  checked, by ``unirank run``'s or ``Parallel``'s parent);
* a port already taken where this process must serve is a :class:`~unirank.errors.ConfigError`
  naming MASTER_PORT;
* any other failure (nothing answers within the timeout, the connection drops) is a
  :class:`StoreError`: one line naming the rank, the address and the timeout, with a hint. The
  bootstrap prints it as its one-line exit; :func:`unirank.init` raises it as ``InitError``.

It also holds the one hand-over from the worker bootstrap to the runtime (:func:`hand_over`,
:func:`take_joined`): the store on which the bootstrap already ran the join check, which the
first :func:`unirank.init` of that process starts its group on without joining again.

torch is imported only when a store is opened.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

from unirank.contract import USE_AGENT_STORE_VAR
from unirank.errors import ConfigError
from unirank.exitcodes import INTERRUPTED
from unirank.signals import keep_off_new_threads

__all__ = ["JoinedStore", "StoreError", "hand_over", "interrupted", "open_store", "take_joined",
           "uses_agent_store"]


class StoreError(RuntimeError):
    """The rendezvous store could not be served or reached.

    ``rank`` is the rank that failed, ``what`` the message without the rank (one line, with
    the hint); ``str()`` is ``rank R what``.
    """

    def __init__(self, rank: int, what: str) -> None:
        self.rank = rank
        self.what = what
        super().__init__(f"rank {rank} {what}")


def uses_agent_store(environ: Mapping[str, str]) -> bool:
    """True when an agent (torchrun's, or unirank's supervisor through the worker bootstrap)
    serves the store, so that every rank, rank 0 included, is a client.

    Reads: TORCHELASTIC_USE_AGENT_STORE.
    """
    return environ.get(USE_AGENT_STORE_VAR) == "True"


def _detail(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


#: a client's first connection attempts are this short, growing to _PROBE_MAX seconds apart
_PROBE_FIRST = 0.05
_PROBE_MAX = 1.0


def _await_listener(addr: str, port: int, *, rank: int, timeout: float, served_by: str,
                    hint: str) -> float:
    """Wait until something accepts connections at ``addr:port``; the seconds left of
    ``timeout`` (at least 1) for torch's own connect.

    torch's client retries a refused connection inside C++ for up to about 2.5 times its
    timeout, printing a C++ frame dump at each retry, and cannot be interrupted (it retries on
    EINTR). Short Python connection attempts instead end at the timeout with a StoreError, and
    a SIGINT ends them at once (:func:`interrupted`).
    """
    import socket
    import time

    deadline = time.monotonic() + timeout
    pause = _PROBE_FIRST
    try:
        while True:
            left = deadline - time.monotonic()
            try:
                socket.create_connection((addr, port), timeout=max(0.05, min(left, 2.0))).close()
                return max(1.0, deadline - time.monotonic())
            except OSError as exc:
                if time.monotonic() + pause >= deadline:
                    of = f" of {served_by}" if served_by else ""
                    raise StoreError(rank, f"could not reach the rendezvous store{of} at "
                                           f"{addr}:{port} within {timeout:g} s "
                                           f"({_detail(exc)}). HINT: {hint}") from None
            time.sleep(pause)
            pause = min(2 * pause, _PROBE_MAX)
    except KeyboardInterrupt:
        interrupted(rank, f"connecting to the rendezvous store at {addr}:{port}")


def interrupted(rank: int, doing: str) -> NoReturn:
    """A SIGINT (KeyboardInterrupt) while this rank was ``doing`` something at start-up: one
    line on stderr and SystemExit(130), as a shell reports an interrupted command."""
    import sys

    print(f"unirank: rank {rank}: interrupted (SIGINT) while {doing}", file=sys.stderr,
          flush=True)
    raise SystemExit(INTERRUPTED) from None


def open_store(
    addr: str,
    port: int,
    *,
    rank: int,
    timeout: float,
    serve: bool = False,
    listen_fd: int | None = None,
    multi_tenant: bool = False,
    served_by: str = "",
    hint: str,
    addr_source: str = "MASTER_ADDR",
    environ: Mapping[str, str] | None = None,
) -> Any:
    """A ``TCPStore`` at ``addr:port``: the server itself with ``serve`` (on ``listen_fd``, a
    socket already listening, when given), else a client; ``timeout`` (seconds) bounds the
    connection and every later wait on it.

    ``served_by`` names who serves the store in the message (``"rank 0"``), ``hint`` what to
    check, ``addr_source`` where ``addr`` came from, ``environ`` the process's environment (for
    :func:`unirank.resolve.require_own`). A client first waits for the port with
    short Python connection attempts (:func:`_await_listener`), so that a SIGINT ends the wait
    and the timeout is kept. Raises ConfigError when ``addr`` does not resolve, or when this
    process must serve and ``addr`` is not this host's or the port is taken; StoreError on any
    other failure.
    """
    from unirank.resolve import require_own, require_resolvable

    require_resolvable(addr, source=addr_source)
    if serve and listen_fd is None:
        require_own(addr, source=addr_source, environ=environ or {})
    connect = timeout
    if not serve:  # the port answers now (a listening socket may answer before its server
        # serves: torch's handshake then waits, for what is left of the timeout)
        connect = _await_listener(addr, port, rank=rank, timeout=timeout, served_by=served_by,
                                  hint=hint)
    with keep_off_new_threads():  # torch's import-time threads
        from torch.distributed import TCPStore  # type: ignore[attr-defined]

    try:
        # the server's loop thread (a client starts none, and may wait here)
        with keep_off_new_threads() if serve else contextlib.nullcontext():
            store = TCPStore(
                addr, port, None, serve, timedelta(seconds=connect), wait_for_workers=False,
                multi_tenant=multi_tenant, master_listen_fd=listen_fd, use_libuv=True,
            )
        if connect != timeout:
            store.set_timeout(timedelta(seconds=timeout))
        return store
    except (RuntimeError, TimeoutError, OSError) as exc:
        text = str(exc)
        if serve and listen_fd is None and (
                "EADDRINUSE" in text or "address already in use" in text.lower()):
            raise ConfigError(
                "is already in use on this host, so rank 0 cannot serve the rendezvous store",
                variable="MASTER_PORT", value=str(port),
                hint="export MASTER_PORT=<a free port, the same on every rank>",
            ) from None
        who = "serve" if serve else "reach"
        of = f" of {served_by}" if served_by else ""
        raise StoreError(rank, f"could not {who} the rendezvous store{of} at {addr}:{port} "
                               f"within {timeout:g} s ({_detail(exc)}). HINT: {hint}") from exc



@dataclass(frozen=True)
class JoinedStore:
    """A store on which this process's worker bootstrap ran the join check for ``rank`` of
    ``world_size`` (the store at ``addr:port``)."""

    store: Any
    pid: int
    rank: int
    world_size: int
    addr: str
    port: int


#: THE seam between the worker bootstrap and the runtime: the bootstrap leaves the store it
#: joined on here (:func:`hand_over`), and the first :func:`unirank.init` takes it
#: (:func:`take_joined`), so that each rank joins once per run. Empty everywhere else.
_HANDED: list[JoinedStore] = []


def hand_over(store: Any, *, rank: int, world_size: int, addr: str, port: int) -> None:
    """The worker bootstrap: every rank has joined on ``store``; leave it for the runtime."""
    _HANDED[:] = [JoinedStore(store, os.getpid(), rank, world_size, addr, port)]


def take_joined(*, rank: int, world_size: int, addr: str, port: int) -> Any | None:
    """The store the bootstrap of this process joined on, for this rank and world at
    ``addr:port``, or None (not started by unirank's bootstrap, another world, or already
    taken: a later :func:`unirank.init` connects and joins again, under its own prefix)."""
    if not _HANDED:
        return None
    joined = _HANDED.pop()
    if (joined.pid, joined.rank, joined.world_size, joined.addr, joined.port) != (
            os.getpid(), rank, world_size, addr, port):
        return None
    return joined.store
