"""pytorch-ignite's start-up options, as unirank reads them (pure; no torch).

``initialize``, ``spawn`` and ``Parallel`` take ignite's keyword options: ``timeout`` (a
``timedelta`` or seconds: unirank's init timeout), ``init_method`` (``None`` or ``"env://"``,
which is what unirank does), and for the process-starting ones ``start_method``, ``join`` and
``daemon``. Anything else is a TypeError naming it, so that no option is silently dropped.
"""

from __future__ import annotations

import warnings
from datetime import timedelta
from typing import Any

from unirank.errors import ConfigError

__all__ = ["seconds", "take_init_timeout", "take_spawn_options"]


def seconds(timeout: Any) -> float | None:
    """``timeout`` (``None``, seconds, or a ``datetime.timedelta``) in seconds."""
    if timeout is None or isinstance(timeout, (int, float)):
        return timeout
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    raise TypeError(f"timeout takes a datetime.timedelta or seconds, not {type(timeout).__name__}")


def take_init_timeout(options: dict[str, Any], what: str) -> float | None:
    """Take ``init_method`` and ``timeout`` out of ``options`` and return the timeout in seconds;
    raise TypeError when other options are left (``what`` names the caller)."""
    init_method = options.pop("init_method", None)
    if init_method not in (None, "env://"):
        raise ConfigError(
            "is not supported: unirank starts the group on its own rendezvous store",
            variable="init_method",
            value=str(init_method),
            hint="leave init_method out; MASTER_ADDR/MASTER_PORT (or the launcher) place the store",
        )
    timeout = seconds(options.pop("timeout", None))
    if options:
        raise TypeError(f"{what}() got options unirank does not take: {', '.join(sorted(options))}")
    return timeout


def take_spawn_options(options: dict[str, Any]) -> None:
    """Take ``start_method``, ``join`` and ``daemon`` out of ``options``: unirank's workers are
    always fresh interpreters whose end is awaited (``"spawn"``, ``join=True``); ``daemon`` has
    no meaning there. Another ``start_method`` is ignored with a warning; ``join=False`` is a
    ConfigError."""
    options.pop("daemon", None)
    if not options.pop("join", True):
        raise ConfigError("is not supported: the workers' end is always awaited", variable="join",
                          value="False", hint="leave join out")
    method = options.pop("start_method", "spawn")
    if method != "spawn":
        warnings.warn(f"start_method={method!r} is ignored: unirank starts each worker as a fresh "
                      "interpreter (as 'spawn' does)", stacklevel=3)
