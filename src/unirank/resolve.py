"""The master address must resolve: the one rule both start-up paths apply before torch sees it.

torch's store client given a name that does not resolve retries for the whole init timeout
(printing a warning each time) and then fails in a C++ frame dump. ``unirank run``'s parent
(before it starts any worker) and :func:`unirank.store.open_store` (under :func:`unirank.init`
and the worker bootstrap) call :func:`require_resolvable` instead, which ends at once with one
line: the name, the variable or option it came from, and what to do.

``getaddrinfo`` itself can block for a long time on a name server that does not answer, so it
runs in a daemon thread bounded by a timeout. This module does not import torch.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Mapping

from unirank.errors import ConfigError

__all__ = ["RESOLVE_TIMEOUT", "master_addr_source", "require_resolvable"]

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


def _lookup(host: str, timeout: float) -> str | None:
    """None when ``host`` resolves within ``timeout`` seconds, else why not."""
    outcome: list[str | None] = []

    def look() -> None:
        try:
            socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            outcome.append(None)
        except (OSError, UnicodeError) as exc:
            outcome.append(str(exc.args[-1]) if exc.args else type(exc).__name__)

    thread = threading.Thread(target=look, name="unirank-resolve", daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        return f"no answer from the name service within {timeout:g} s"
    return outcome[0]


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
