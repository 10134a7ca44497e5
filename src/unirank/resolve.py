"""The master address must resolve, and where the store is served it must be this host's: the
rules both start-up paths apply before torch sees the address.

torch's store client given a name that does not resolve retries for the whole init timeout
(printing a warning each time) and then fails in a C++ frame dump. ``unirank run``'s parent
(before it starts any worker) and :func:`unirank.store.open_store` (under :func:`unirank.init`
and the worker bootstrap) call :func:`require_resolvable` instead, which ends at once with one
line: the name, the variable or option it came from, and what to do.

The process that serves the rendezvous store (node rank 0's ``unirank run`` or ``Parallel``,
and rank 0 of :func:`unirank.init` where no agent serves it) also calls :func:`require_own`:
a master address that is none of this host's addresses (a stale ``MASTER_ADDR`` from a shell
profile) would leave every rank waiting for the whole init timeout, so it ends at once with one
line instead. It decides from this host's interface addresses (:mod:`unirank.hostaddrs`) and
sends nothing.

``getaddrinfo`` itself can block for a long time on a name server that does not answer, so it
runs in a daemon thread bounded by a timeout. :func:`lookup` and :func:`reverse_lookup` are the
only name look-ups of unirank (tests/test_layout_rules.py keeps it so): the store's listening
family (:mod:`unirank.supervisor.listen`), the route to an address (:mod:`unirank.netroute`) and
doctor's timed look-ups (:mod:`unirank.doctor.netinfo`) ask them. This module does not import
torch.

Reads: UNIRANK_MASTER_FORWARDED (:func:`require_own`, from the mapping it is given).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from unirank.errors import ConfigError
from unirank.signals import start_shielded

__all__ = ["RESOLVE_TIMEOUT", "Bounded", "bounded", "lookup", "master_addr_source", "require_own",
           "require_resolvable", "reverse_lookup", "same_address"]

_T = TypeVar("_T")

#: seconds a name lookup may take before the name counts as not resolving
RESOLVE_TIMEOUT = 10.0


def master_addr_source(sources: Mapping[str, str], default: str = "MASTER_ADDR") -> str:
    """Where the master address came from, as a :class:`~unirank.distenv.DistEnv`'s
    ``sources`` says (``MASTER_ADDR``, ``first host of SLURM_STEP_NODELIST``...)."""
    return sources.get("master_addr") or default


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Bounded(Generic[_T]):
    """What :func:`bounded` got: ``value`` (None on an error or a timeout), ``error`` (the
    OSError or UnicodeError raised, or None), ``seconds`` taken, and whether the call was still
    running at the bound."""

    value: _T | None
    error: OSError | UnicodeError | None
    seconds: float
    timed_out: bool


def bounded(fn: Callable[[], _T], limit: float) -> Bounded[_T]:
    """``fn()`` (a name look-up: OSError and UnicodeError are its failures) in a daemon thread,
    waited for at most ``limit`` seconds, so that a name server that does not answer cannot
    hold the caller up. The one bounded look-up of unirank (start-up checks and doctor)."""
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["value"] = fn()
        except (OSError, UnicodeError) as exc:
            box["error"] = exc

    start = time.monotonic()
    thread = threading.Thread(target=call, name="unirank-lookup", daemon=True)
    start_shielded(thread)
    thread.join(limit)
    seconds = time.monotonic() - start
    if thread.is_alive():
        return Bounded(None, None, seconds, True)
    return Bounded(box.get("value"), box.get("error"), seconds, False)


def lookup(host: str, port: int | None = None, *, family: int = 0,
           kind: int = socket.SOCK_STREAM, timeout: float | None = None) -> Bounded[list[Any]]:
    """``socket.getaddrinfo(host, port, family, kind)`` bounded by ``timeout`` seconds (default
    :data:`RESOLVE_TIMEOUT`): the one forward look-up of unirank."""
    limit = RESOLVE_TIMEOUT if timeout is None else timeout
    return bounded(lambda: list(socket.getaddrinfo(host, port, family, kind)), limit)


def reverse_lookup(address: str, *, timeout: float | None = None) -> Bounded[str]:
    """The name ``address`` maps back to (``gethostbyaddr``, as torch's store asks), bounded by
    ``timeout`` seconds (default :data:`RESOLVE_TIMEOUT`): the one reverse look-up of unirank."""
    limit = RESOLVE_TIMEOUT if timeout is None else timeout
    return bounded(lambda: socket.gethostbyaddr(address)[0], limit)


def _lookup(host: str, timeout: float) -> str | None:
    """None when ``host`` resolves within ``timeout`` seconds, else why not."""
    found = lookup(host, timeout=timeout)
    if found.timed_out:
        return f"no answer from the name service within {timeout:g} s"
    if found.error is None:
        return None
    return str(found.error.args[-1]) if found.error.args else type(found.error).__name__


def require_resolvable(host: str, *, source: str, timeout: float = RESOLVE_TIMEOUT) -> None:
    """Raise a one-line ConfigError naming ``host`` and ``source`` (the variable or option it
    came from) when ``host`` does not resolve within ``timeout`` seconds; return at once for
    an IP address."""
    if not host or _is_literal(host):
        return
    why = _lookup(host, timeout)
    if why is None:
        return
    raise ConfigError(
        f"the master host does not resolve ({why}), so no rank could reach the rendezvous",
        variable=source, value=host,
        hint="give the host name or address of rank 0's node, one that resolves on every node "
             f"(check: getent hosts {host})",
    )


def _addresses(host: str, timeout: float) -> tuple[str, ...] | None:
    """``host`` itself for an IP address, else the addresses it resolves to within ``timeout``
    seconds (None: it does not resolve in time, which :func:`require_resolvable` reports)."""
    if _is_literal(host):
        return (host,)
    found = lookup(host, timeout=timeout)
    if found.value is None:
        return None
    return tuple(str(info[4][0]) for info in found.value)


def same_address(first: str, second: str, *, timeout: float = RESOLVE_TIMEOUT) -> bool:
    """Whether the hosts ``first`` and ``second`` (names or addresses) have an address in
    common; False when either does not resolve within ``timeout`` seconds."""
    ours, theirs = _addresses(first, timeout), _addresses(second, timeout)
    return bool(ours and theirs and set(ours) & set(theirs))


def require_own(host: str, *, source: str, environ: Mapping[str, str],
                timeout: float = RESOLVE_TIMEOUT,
                ifaces: Mapping[str, tuple[str, ...]] | None = None) -> None:
    """Raise a one-line ConfigError naming ``host`` and ``source`` when ``host``, the master
    address of a store this process is about to serve, is none of this host's addresses
    (loopback, unspecified, any interface's; a name counts when it resolves to one of them).
    ``ifaces``: this host's interfaces (default :func:`unirank.hostaddrs.interfaces`). A name
    that does not resolve within ``timeout`` is left to :func:`require_resolvable`.

    Reads: UNIRANK_MASTER_FORWARDED (from ``environ``; on, :func:`unirank.contract.flag`,
    it skips the check, for an address
    forwarded to this host: NAT, a virtual or cloud public address).
    """
    from unirank import hostaddrs
    from unirank.contract import MASTER_FORWARDED_VAR, flag

    if flag(environ, MASTER_FORWARDED_VAR):
        return

    addresses = _addresses(host, timeout) if host else None
    if addresses is None:
        return
    ifaces = hostaddrs.interfaces() if ifaces is None else ifaces
    if any(hostaddrs.is_own(address, ifaces) for address in addresses):
        return
    own = [a for names in ifaces.values() for a in names
           if not hostaddrs.is_own(a, {}) and not a.startswith("fe80:")]
    resolved = "" if _is_literal(host) else f" ({', '.join(addresses)})"
    raise ConfigError(
        f"is not an address of this host{resolved}, but rank 0 serves the rendezvous store "
        "here, so no rank would find it there (each would wait out the init timeout)",
        variable=source, value=host,
        hint=f"give {source} this node's host name or one of its addresses (127.0.0.1 will "
             "do on one node" + (f"; here: {', '.join(own[:4])}" if own else "")
             + f"), or set {MASTER_FORWARDED_VAR}=1 if it is forwarded to this host",
    )
