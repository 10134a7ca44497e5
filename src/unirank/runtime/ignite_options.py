"""pytorch-ignite's start-up options, as unirank reads them (pure; no torch).

``initialize``, ``spawn`` and ``Parallel`` take ignite's keyword options: ``timeout`` (a
``timedelta`` or seconds: unirank's init timeout), ``init_method`` (:func:`init_method`), and
for the process-starting ones ``start_method``, ``join`` and ``daemon``. Anything else is a
TypeError naming it, so that no option is silently dropped.
"""

from __future__ import annotations

import warnings
from datetime import timedelta
from typing import Any

from unirank.errors import ConfigError

__all__ = ["init_method", "init_timeout_given", "seconds", "take_init_timeout",
           "take_spawn_options"]


def seconds(timeout: Any) -> float | None:
    """``timeout`` (``None``, seconds, or a ``datetime.timedelta``) in seconds."""
    if timeout is None or isinstance(timeout, (int, float)):
        return timeout
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    raise TypeError(f"timeout takes a datetime.timedelta or seconds, not {type(timeout).__name__}")


def init_timeout_given(init_timeout: Any, timeout: Any) -> tuple[Any, str]:
    """The init timeout a caller gave, as ``init_timeout=`` (unirank's word, everywhere) or
    ``timeout=`` (ignite's, accepted where ignite has it), and the keyword it came by, which an
    error about its value names. A ``timedelta`` becomes seconds; other values are left for
    :func:`unirank.contract.resolve_init_timeout` to check. Both given is a ConfigError."""
    if init_timeout is not None and timeout is not None:
        raise ConfigError("is given twice, also as timeout=", variable="init_timeout",
                          value=str(init_timeout), hint="give the init timeout once")
    if timeout is not None:
        return (timeout.total_seconds() if isinstance(timeout, timedelta) else timeout), "timeout"
    if isinstance(init_timeout, timedelta):
        return init_timeout.total_seconds(), "init_timeout"
    return init_timeout, "init_timeout"


def init_method(value: str | None) -> str | None:
    """``init_method`` as unirank uses it: ``None`` for ``None`` and ``"env://"`` (unirank's own
    rendezvous store on the master address and port), ``"file://PATH"`` as it is (a store in
    that file: every rank must see it). ``"tcp://..."`` is a ValueError, as in ignite 0.5.5
    (set MASTER_ADDR and MASTER_PORT instead), and so is any other scheme (both are
    :class:`~unirank.errors.ConfigError`, a ValueError)."""
    if value is None or value == "env://":
        return None
    if value.startswith("tcp://"):
        raise ConfigError(
            f"TCP initialization via init_method='{value}' will hang. To fix this, please "
            "configure MASTER_ADDR and MASTER_PORT in the environment and use 'env://' (or omit "
            "init_method).", variable="init_method", value=value,
            hint="leave init_method out and set MASTER_ADDR and MASTER_PORT")
    if value.startswith("file://"):
        return value
    raise ConfigError("is not an init method unirank takes", variable="init_method",
                      value=value, hint="use None, 'env://' or 'file://PATH'")


def take_init_timeout(options: dict[str, Any], what: str) -> float | None:
    """Take ``timeout`` out of ``options`` and return it in seconds; raise TypeError when other
    options are left (``what`` names the caller)."""
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
