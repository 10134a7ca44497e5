"""What a spawned worker gets by value: a function (and what it uses) defined in ``__main__`` --
a script, a Jupyter notebook's cells, the ``python`` prompt, ``python -c``, a script read from
stdin -- and whether the worker runs the parent's ``__main__`` again.

multiprocessing's ``spawn`` re-creates the parent's ``__main__`` in each worker from the
script's path or the module's name, running the script's top level again: a script without
``if __name__ == "__main__":`` would launch again from every worker. An interactive ``__main__``
has neither path nor name, so what it defines cannot be pickled by reference at all. So what a
call uses of ``__main__`` goes by value, with cloudpickle (the optional ``notebook`` extra: ``pip
install 'unirank[notebook]'``), and the worker does not run ``__main__`` (:func:`shipping`, the
decision). Without cloudpickle, a script's functions go by reference and the worker imports the
script as multiprocessing does (the guard is then needed: a launch from a worker importing
``__main__`` is refused, :func:`unirank.runtime.worker.importing_main`); an interactive
``__main__``'s cannot go at all, which the caller is told in one line
(:class:`~unirank.errors.ConfigError`). Everything else keeps the standard pickle.

Reads: no environment variable.
"""

from __future__ import annotations

import collections
import importlib
import io
import os
import pickle
import types
from collections.abc import Mapping, Sequence
from typing import Any

from unirank.errors import ConfigError

__all__ = ["EXTRA_HINT", "MAIN_KEYS", "dumps", "have_cloudpickle", "interactive_main",
           "main_objects", "shipping", "worker_preparation"]

#: how to install what by-value pickling needs
EXTRA_HINT = "pip install 'unirank[notebook]' (or pip install cloudpickle)"
_MAIN = "__main__"
#: the keys of multiprocessing's preparation that make a worker run the parent's ``__main__``
MAIN_KEYS = ("init_main_from_path", "init_main_from_name")


def interactive_main(preparation: Mapping[str, Any]) -> bool:
    """True when a worker cannot re-create the parent's ``__main__``: multiprocessing's
    ``preparation`` (:func:`multiprocessing.spawn.get_preparation_data`) names neither its
    module nor a file it was read from (a notebook, the ``python`` prompt, ``python -c``;
    a script read from stdin names ``<stdin>``, which is no file)."""
    path = preparation.get("init_main_from_path")
    return "init_main_from_name" not in preparation and (
        path is None or not os.path.isfile(path))


def shipping(names: Sequence[str], *, interactive: bool, cloudpickle: bool) -> tuple[bool, bool]:
    """How a call goes to the workers: ``(by_value, import_main)``. ``names``: what of
    ``__main__`` it uses (:func:`main_objects`); ``interactive``: ``__main__`` has no file nor
    module name (:func:`interactive_main`); ``cloudpickle``: it can be imported. By value
    whenever it uses ``__main__`` and can (an interactive ``__main__`` always, so that the
    missing cloudpickle is named); the worker imports ``__main__`` only when what the call uses
    of it goes by reference (a script or module, without cloudpickle)."""
    if not names:
        return False, False
    if interactive or cloudpickle:
        return True, False
    return False, True


def worker_preparation(preparation: Mapping[str, Any], *,
                       import_main: bool = True) -> dict[str, Any]:
    """``preparation`` as a worker applies it: without the parent's ``__main__`` unless
    ``import_main``, and never with a path that is no file (multiprocessing's ``spawn`` would
    fail on ``<stdin>``)."""
    kept = dict(preparation)
    if not import_main or interactive_main(kept):
        for key in MAIN_KEYS:
            kept.pop(key, None)
    return kept


def have_cloudpickle() -> bool:
    """Whether cloudpickle can be imported here."""
    try:
        importlib.import_module("cloudpickle")
    except ImportError:
        return False
    return True


class _MainFinder(pickle.Pickler):
    """A pickler that writes nothing and notes the functions and classes of ``__main__`` it
    meets (pickle would save them by name); each is pickled as its name, so that the search
    goes on past it."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL)
        self.found: list[str] = []

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (types.FunctionType, type)) and \
                getattr(obj, "__module__", None) == _MAIN:
            name = str(getattr(obj, "__qualname__", None) or repr(obj))
            self.found.append(name)
            return (str, (name,))
        return NotImplemented


def main_objects(obj: Any) -> list[str]:
    """The names of the functions and classes of ``__main__`` that pickling ``obj`` saves by
    reference (empty when none, or when ``obj`` cannot be pickled at all: :func:`dumps` says
    why then)."""
    finder = _MainFinder()
    try:
        finder.dump(obj)
    except Exception:  # unpicklable: dumps() names the error
        return finder.found
    return finder.found


def _cloudpickle(what: str, names: Sequence[str]) -> Any:
    """The cloudpickle module, or the one line that says ``what`` (using ``names``) needs it."""
    try:
        return importlib.import_module("cloudpickle")
    except ImportError:
        uses = f" ({', '.join(dict.fromkeys(names))})" if names else ""
        raise ConfigError(
            f"{what}{uses} is defined in a notebook cell or at the python prompt (an "
            f"interactive __main__), so it goes to the workers by value, which needs "
            f"cloudpickle", hint=EXTRA_HINT) from None


def _by_reference_failed(what: str, names: Sequence[str], exc: Exception) -> ConfigError:
    """A script's ``__main__`` object that pickle cannot find by name (a lambda, a nested
    function) without cloudpickle."""
    uses = f" ({', '.join(dict.fromkeys(names))})"
    return ConfigError(
        f"{what}{uses} is defined in the script's __main__ and cannot be pickled by name "
        f"({type(exc).__name__}: {exc}); it goes to the workers by value with cloudpickle",
        hint=EXTRA_HINT)


#: what cloudpickle writes for every code object's file name (so that tracebacks lose it)
_DYNAMIC_CODE = "<dynamic-code>"


def _by_value_dumps(cloudpickle: Any, obj: Any) -> bytes:
    """``obj`` through cloudpickle, keeping each function's file name: cloudpickle writes
    ``<dynamic-code>`` instead, so that a worker's traceback would name neither the script nor
    its line's text. A cloudpickle without that reduction pickles as it does."""
    reduce_code = cloudpickle.Pickler.dispatch_table.get(types.CodeType)
    if reduce_code is None:
        data: bytes = cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        return data

    def keep_filename(code: types.CodeType) -> Any:
        rebuild, fields = reduce_code(code)
        return rebuild, tuple(code.co_filename if field == _DYNAMIC_CODE else field
                              for field in fields)

    class Pickler(cloudpickle.Pickler):  # type: ignore[misc,name-defined,unused-ignore]
        dispatch_table = collections.ChainMap({types.CodeType: keep_filename},
                                              cloudpickle.Pickler.dispatch_table)

    buffer = io.BytesIO()
    Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def dumps(obj: Any, *, by_value: bool, what: str, names: Sequence[str] = ()) -> bytes:
    """``obj`` pickled, by value through cloudpickle when ``by_value`` (``names``: what of
    ``__main__`` it uses, :func:`main_objects`); what cannot be pickled is a one-line
    :class:`~unirank.errors.ConfigError` naming ``what`` (and cloudpickle, when what of a
    script's ``__main__`` it uses cannot go by name)."""
    cloudpickle: Any = _cloudpickle(what, names) if by_value else None
    try:
        data = (_by_value_dumps(cloudpickle, obj) if by_value
                else pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception as exc:  # pickling raises many kinds
        if names and not by_value:
            raise _by_reference_failed(what, names, exc) from None
        raise ConfigError(
            f"{what} cannot be pickled ({type(exc).__name__}: {exc})",
            hint="use values that pickle (numbers, strings, tensors, dicts, state_dicts); "
                 "define functions and classes at module level or in a notebook cell") from None
    return data
