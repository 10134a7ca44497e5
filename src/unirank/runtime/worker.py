"""A function run on every rank: :class:`Call` (what :class:`~unirank.runtime.parallel.Parallel`
pickles for its workers) and :func:`run_call` (start the group, call ``fn(local_rank, ...)``,
end it), the one place that does so for ``Parallel`` in place, for its spawned workers and for
a backend's own launcher.

:func:`run_call_file` is the one seam from ``supervisor/`` into ``runtime/``: the worker
bootstrap (:mod:`unirank.supervisor.worker.target`) calls it for ``--call FILE`` and imports nothing
else from here.
"""

from __future__ import annotations

import multiprocessing.spawn
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from unirank.errorfile import record_exception
from unirank.errors import ConfigError

__all__ = ["Call", "read_call", "run_call", "run_call_file", "write_call"]


@dataclass(frozen=True)
class Call:
    """``fn(local_rank, *args, **kwargs)`` on every rank, in a group of ``backend`` started
    within ``init_timeout`` seconds (``None``: UNIRANK_INIT_TIMEOUT, else 300), on the store
    ``init_method`` names (``None``: unirank's own; ``"file://PATH"``)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    backend: str | None = None
    init_timeout: float | None = None
    init_method: str | None = None


def run_call(call: Call, local_rank: int, *, start_group: bool = True) -> None:
    """Start the group (unless ``start_group`` is False: the caller did), call
    ``fn(local_rank, ...)``, and end the group it started. An exception is recorded in the
    worker's error file at once (before the group goes away and the peers fail too) and
    raised; the group is then left to the process's end.

    Reads: TORCHELASTIC_ERROR_FILE, and what :func:`unirank.init` reads.
    """
    from unirank.runtime import lifecycle

    try:
        if start_group:
            lifecycle.init(call.backend, call.init_timeout, call.init_method)
        call.fn(local_rank, *call.args, **call.kwargs)
    except BaseException as exc:
        record_exception(exc)
        raise
    if start_group:
        lifecycle.finalize()


def write_call(call: Call, path: str) -> None:
    """Pickle ``call`` to ``path`` with this process's ``__main__`` and ``sys.path``
    (multiprocessing's ``spawn`` preparation), for :func:`read_call` in a worker."""
    preparation = multiprocessing.spawn.get_preparation_data("unirank-worker")
    preparation.pop("authkey", None)  # not picklable, and the workers need none
    with open(path, "wb") as fh:
        # the call is pickled on its own, so that it is unpickled after the preparation
        pickle.dump((preparation, pickle.dumps(call)), fh)


def read_call(path: str) -> Call:
    """The call :func:`write_call` wrote, after setting up ``sys.path`` and ``__main__`` as
    the parent had them."""
    with open(path, "rb") as fh:
        preparation, payload = pickle.load(fh)
    multiprocessing.spawn.prepare(preparation)
    call = pickle.loads(payload)
    if not isinstance(call, Call):
        raise SystemExit(f"unirank: {path} does not hold a unirank call")
    return call


def run_call_file(path: str) -> None:
    """A spawned worker: run the call in ``path`` on this rank.

    A :class:`~unirank.errors.ConfigError` (a launch or usage mistake, the same on every rank)
    is recorded, not printed: the worker exits with code 1 and ``Parallel`` raises it again in
    the parent as its one line. Any other exception keeps its traceback.
    """
    from unirank.runtime import state

    call = read_call(path)
    try:
        run_call(call, state.get_local_rank())
    except ConfigError:
        raise SystemExit(1) from None
