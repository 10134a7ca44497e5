"""``ur.launch(fn, ..., nproc_per_node=N)``: the notebook's way to run ``fn`` on N new workers of
this machine (docs/notebooks.md), over :class:`~unirank.runtime.parallel.Parallel`.

``launch``'s own options are keywords it names (:data:`OPTIONS`); ``fn``'s arguments come as
``args=`` (a sequence) and ``kwargs=`` (a mapping), which cannot collide with them. The older
form stays: positional arguments after ``fn`` and any keyword that is not one of ``launch``'s
go to ``fn`` (:func:`fn_arguments`, pure), but not both forms at once.

Reads: what :class:`~unirank.runtime.parallel.Parallel` reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from unirank.errors import ConfigError
from unirank.runtime.parallel import LOGGER_NAME, Parallel
from unirank.runtime.worker import refuse_launch_while_importing_main

__all__ = ["OPTIONS", "fn_arguments", "launch"]

#: ``launch``'s own keywords (never given to ``fn``)
OPTIONS = ("nproc_per_node", "backend", "init_timeout", "hang_report_after", "hang_timeout",
           "on_hang", "args", "kwargs")


def fn_arguments(positional: Sequence[Any], keywords: Mapping[str, Any],
                 args: Sequence[Any] | None,
                 kwargs: Mapping[str, Any] | None) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``fn``'s positional and keyword arguments: ``args=``/``kwargs=`` when given, else the
    extra positional arguments and keywords of the older form. Both forms for the same kind is a
    one-line ConfigError; so is an ``args`` that is a string or no sequence, or a ``kwargs``
    that is no mapping."""
    if args is not None:
        if positional:
            raise ConfigError("is given together with positional arguments after fn",
                              variable="args", value=repr(tuple(args)),
                              hint="pass fn's positional arguments one way: args=(...)")
        if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
            raise ConfigError("must be a tuple or list of fn's positional arguments",
                              variable="args", value=repr(args),
                              hint="write args=(value,) for one argument")
        positional = args
    if kwargs is not None:
        if keywords:
            raise ConfigError(f"is given together with fn's keywords {sorted(keywords)}",
                              variable="kwargs", value=repr(dict(kwargs)),
                              hint="pass fn's keyword arguments one way: kwargs={...}")
        if not isinstance(kwargs, Mapping):
            raise ConfigError("must be a dict of fn's keyword arguments", variable="kwargs",
                              value=repr(kwargs), hint="write kwargs={'name': value}")
        keywords = kwargs
    return tuple(positional), dict(keywords)


def launch(fn: Callable[..., Any], *fn_args: Any, nproc_per_node: int, backend: str = "auto",
           init_timeout: float | None = None, hang_report_after: str | float | None = None,
           hang_timeout: str | float | None = None, on_hang: str | None = None,
           args: Sequence[Any] | None = None,
           kwargs: Mapping[str, Any] | None = None, **fn_kwargs: Any) -> list[Any]:
    """Run ``fn(local_rank, *args, **kwargs)`` on ``nproc_per_node`` new workers of this
    machine, in a group of ``backend``, and return what it returned on each, by rank: the
    notebook's way to train on several processes (docs/notebooks.md).

    ``launch``'s options, by name: ``nproc_per_node`` (required), ``backend`` (``"auto"``),
    ``init_timeout`` (seconds every rank waits for the others to join; default
    UNIRANK_INIT_TIMEOUT, else 300), ``hang_report_after`` and ``hang_timeout`` (the hang
    detector's, as ``unirank run --hang-report-after/--hang-timeout``), ``on_hang`` (``"exit"``
    or ``"restart"``, as ``unirank run --on-hang``). ``fn``'s arguments:
    ``args=(...)`` and ``kwargs={...}`` (or, as before, positional arguments after ``fn`` and
    keywords that are none of ``launch``'s: :func:`fn_arguments`).

    ``fn`` may be defined in a notebook cell, at the ``python`` prompt or at a script's top
    level (it goes by value: cloudpickle, the ``notebook`` extra). The workers are forked from
    unirank's fork server, a fresh interpreter (never from this process, which may hold threads
    and CUDA); their lines reach ``sys.stdout`` / ``sys.stderr`` whole, each prefixed
    ``[rank<N>]:``. An exception in a worker stops the others and is raised here as
    :class:`~unirank.runtime.parallel.WorkerFailedError` caused by that rank's traceback; an
    interrupt (Ctrl-C, the kernel's interrupt) stops every worker and raises
    ``KeyboardInterrupt``. Return values come back pickled (a CUDA tensor comes back on its
    device: return ``.cpu()``); one that cannot be pickled is a one-line
    :class:`~unirank.errors.ConfigError`. Under a launcher that already placed several
    processes here, ``fn`` runs in place and the list holds this rank's value. ``Parallel``'s
    start and end lines (its logger, :data:`~unirank.runtime.parallel.LOGGER_NAME`) stay quiet
    unless its level was set. The fork server stays between calls (idle: one process that
    imported torch, no thread, no CUDA), so that the next call starts its workers at once; it
    ends with this process, and a new one replaces it when it ended or when this process's
    interpreter variables changed. Called while a worker runs a script's ``__main__`` again
    (a script without ``if __name__ == "__main__":`` whose function goes by name), it is
    refused in one line.

    Reads: what :class:`~unirank.runtime.parallel.Parallel` reads.
    """
    refuse_launch_while_importing_main("ur.launch")
    call_args, call_kwargs = fn_arguments(fn_args, fn_kwargs, args, kwargs)
    logger = logging.getLogger(LOGGER_NAME)
    level = logger.level
    if level == logging.NOTSET:
        logger.setLevel(logging.WARNING)
    try:
        with Parallel(backend, nproc_per_node=nproc_per_node, init_timeout=init_timeout,
                      hang_report_after=hang_report_after, hang_timeout=hang_timeout,
                      on_hang=on_hang, tag_output=True, keep_server=True) as parallel:
            return parallel.run(fn, *call_args, **call_kwargs)
    finally:
        logger.setLevel(level)
