"""A function run on every rank: :class:`Call` (what :class:`~unirank.runtime.parallel.Parallel`
pickles for its workers) and :func:`run_call` (start the group, call ``fn(local_rank, ...)``,
end it), the one place that does so for ``Parallel`` in place, for its spawned workers and for
a backend's own launcher.

A call goes to the workers in a file (:func:`write_call`): pickled by value with cloudpickle
when it uses a function or class of ``__main__`` (a script, a notebook, the ``python`` prompt:
:mod:`.byvalue`), else with the standard pickle; a worker runs the parent's ``__main__`` again
only when the call uses it by reference (no cloudpickle), and a launch made then (an unguarded
script) is refused in one line (:func:`refuse_launch_while_importing_main`). Each spawned
worker writes ``fn``'s return value to the call's ``results`` folder (:func:`write_result`,
pickled the same way), where the parent reads them by local rank (:func:`read_results`).

:func:`run_call_file` is the one seam from ``supervisor/`` into ``runtime/``: the worker
bootstrap (:mod:`unirank.supervisor.worker.target`) calls it for ``--call FILE`` and imports nothing
else from here.
"""

from __future__ import annotations

import contextlib
import multiprocessing.spawn
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from unirank.errorfile import record_exception
from unirank.errors import ConfigError
from unirank.runtime import byvalue

__all__ = ["Call", "importing_main", "read_call", "read_results",
           "refuse_launch_while_importing_main", "run_call", "run_call_file", "write_call",
           "write_result"]


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
    #: the folder where each spawned worker writes ``fn``'s return value (None: nowhere)
    results: str | None = None
    #: the call was pickled by value (cloudpickle; set by :func:`write_call`)
    by_value: bool = False


def run_call(call: Call, local_rank: int, *, start_group: bool = True) -> Any:
    """Start the group (unless ``start_group`` is False: the caller did), call
    ``fn(local_rank, ...)``, end the group it started, and return what ``fn`` returned. An
    exception is recorded in the
    worker's error file at once (before the group goes away and the peers fail too) and
    raised; the group is then left to the process's end.

    Reads: TORCHELASTIC_ERROR_FILE, and what :func:`unirank.init` reads.
    """
    from unirank.runtime import lifecycle

    try:
        if start_group:
            lifecycle.init(call.backend, call.init_timeout, call.init_method)
        value = call.fn(local_rank, *call.args, **call.kwargs)
    except BaseException as exc:
        record_exception(exc)
        raise
    if start_group:
        lifecycle.finalize()
    return value


def write_call(call: Call, path: str) -> None:
    """Pickle ``call`` to ``path`` with this process's ``sys.path`` and, when the call needs it
    by reference, ``__main__`` (multiprocessing's ``spawn`` preparation), for :func:`read_call`
    in a worker: by value when it uses what ``__main__`` defines (:func:`.byvalue.shipping`).
    A call that cannot be pickled, or needs cloudpickle where it is missing, is a one-line
    :class:`~unirank.errors.ConfigError`."""
    preparation = multiprocessing.spawn.get_preparation_data("unirank-worker")
    preparation.pop("authkey", None)  # not picklable, and the workers need none
    names = byvalue.main_objects(call)
    by_value, import_main = byvalue.shipping(
        names, interactive=byvalue.interactive_main(preparation),
        cloudpickle=bool(names) and byvalue.have_cloudpickle())
    what = f"the function {_name(call.fn)} or its arguments"
    interactive = byvalue.interactive_main(preparation)
    try:  # the call is pickled on its own, so that it is unpickled after the preparation
        payload = byvalue.dumps(replace(call, by_value=by_value), by_value=by_value,
                                what=what, names=names)
    except ConfigError:
        if not by_value or interactive:
            raise
        # a script's function that does not go by value (it holds a module object cloudpickle
        # cannot take, as ignite's shim): by name, the worker importing the script as
        # __mp_main__ (multiprocessing's way; its launches are refused there in one line)
        by_value, import_main = False, True
        payload = byvalue.dumps(replace(call, by_value=False), by_value=False, what=what,
                                names=names)
    preparation = byvalue.worker_preparation(preparation, import_main=import_main)
    with open(path, "wb") as fh:
        pickle.dump((preparation, payload), fh)


def _name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))


def _result_path(folder: str, local_rank: int) -> str:
    return os.path.join(folder, f"{local_rank}.pickle")


def write_result(call: Call, local_rank: int, value: Any) -> None:
    """Write ``fn``'s return value on ``local_rank`` to the call's ``results`` folder (whole or
    not at all), pickled as the call was; one that cannot be pickled is a one-line
    :class:`~unirank.errors.ConfigError`."""
    if call.results is None:
        return
    data = byvalue.dumps(value, by_value=call.by_value,
                         what=f"the return value of {_name(call.fn)} on local rank {local_rank}")
    path = _result_path(call.results, local_rank)
    with open(f"{path}.part", "wb") as fh:
        fh.write(data)
    os.replace(f"{path}.part", path)


def read_results(folder: str, local_ranks: list[int]) -> list[Any]:
    """The return values the workers wrote (:func:`write_result`), in the order of
    ``local_ranks``; None for a worker that wrote none (it ended through ``sys.exit(0)``)."""
    values = []
    for local_rank in local_ranks:
        path = _result_path(folder, local_rank)
        value = None
        with contextlib.suppress(FileNotFoundError), open(path, "rb") as fh:
            value = pickle.load(fh)
        values.append(value)
    return values


#: True while this worker runs the parent's ``__main__`` again (see :func:`importing_main`)
_importing_main = False


def importing_main() -> bool:
    """Whether this process is a worker running its parent's ``__main__`` again (a script's
    functions going by reference): a launch then is the script's top level, unguarded, and is
    refused (:func:`refuse_launch_while_importing_main`)."""
    return _importing_main


def refuse_launch_while_importing_main(what: str) -> None:
    """Refuse ``what`` (``ur.launch``, ``Parallel``) in one line when this worker is running the
    parent's ``__main__`` again, as multiprocessing refuses a new process then: the script's
    launch has no ``if __name__ == "__main__":`` guard and would start workers from every
    worker."""
    if _importing_main:
        raise ConfigError(
            f"{what} was called while a worker was importing the script as __main__ (to find "
            "the function by name): the script starts workers at its top level, without "
            "if __name__ == \"__main__\":, so each worker would start its own",
            hint="put the code that launches under if __name__ == \"__main__\": "
                 "(docs/notebooks.md), or install cloudpickle so that the script's functions go "
                 "by value and the workers do not run it")


def read_call(path: str) -> Call:
    """The call :func:`write_call` wrote, after setting up ``sys.path`` and, when the call needs
    it, ``__main__`` as the parent had them."""
    global _importing_main
    with open(path, "rb") as fh:
        preparation, payload = pickle.load(fh)
    _importing_main = any(key in preparation for key in byvalue.MAIN_KEYS)
    try:
        multiprocessing.spawn.prepare(preparation)
    finally:
        _importing_main = False
    call = pickle.loads(payload)
    if not isinstance(call, Call):
        raise SystemExit(f"unirank: {path} does not hold a unirank call")
    return call


def run_call_file(path: str) -> None:
    """A spawned worker: run the call in ``path`` on this rank, and write what it returned
    (:func:`write_result`).

    A :class:`~unirank.errors.ConfigError` (a launch or usage mistake, the same on every rank)
    is recorded, not printed: the worker exits with code 1 and ``Parallel`` raises it again in
    the parent as its one line. Any other exception keeps its traceback.
    """
    from unirank.runtime import state

    try:
        call = read_call(path)
    except ConfigError as exc:  # the script's top level launched again (unguarded)
        record_exception(exc)
        raise SystemExit(1) from None
    local_rank = state.get_local_rank()
    try:
        value = run_call(call, local_rank)
        try:
            write_result(call, local_rank, value)
        except ConfigError as exc:
            record_exception(exc)
            raise
    except ConfigError:
        raise SystemExit(1) from None
