"""What a spawned worker gets by value: a function (and what it uses) defined in an interactive
``__main__`` -- a Jupyter notebook's cells, the ``python`` prompt, ``python -c``, a script read
from stdin.

A worker re-creates the parent's ``__main__`` as multiprocessing's ``spawn`` does: from the
script's path or the module's name. An interactive ``__main__`` has neither, so a function,
class or lambda defined there cannot be pickled by reference (its name would not be found in
the worker). Such a payload is pickled by value with cloudpickle (the optional ``notebook``
extra: ``pip install 'unirank[notebook]'``); everything else keeps the standard pickle. When
cloudpickle is missing and a payload needs it, the caller gets one line saying so
(:class:`~unirank.errors.ConfigError`).

Reads: no environment variable.
"""

from __future__ import annotations

import importlib
import io
import os
import pickle
import types
from collections.abc import Mapping, Sequence
from typing import Any

from unirank.errors import ConfigError

__all__ = ["EXTRA_HINT", "dumps", "interactive_main", "main_objects", "needs_by_value",
           "worker_preparation"]

#: how to install what by-value pickling needs
EXTRA_HINT = "pip install 'unirank[notebook]' (or pip install cloudpickle)"
_MAIN = "__main__"


def interactive_main(preparation: Mapping[str, Any]) -> bool:
    """True when a worker cannot re-create the parent's ``__main__``: multiprocessing's
    ``preparation`` (:func:`multiprocessing.spawn.get_preparation_data`) names neither its
    module nor a file it was read from (a notebook, the ``python`` prompt, ``python -c``;
    a script read from stdin names ``<stdin>``, which is no file)."""
    path = preparation.get("init_main_from_path")
    return "init_main_from_name" not in preparation and (
        path is None or not os.path.isfile(path))


def worker_preparation(preparation: Mapping[str, Any]) -> dict[str, Any]:
    """``preparation`` as a worker can apply it: without a ``__main__`` path that is no file
    (multiprocessing's ``spawn`` would fail on ``<stdin>``)."""
    kept = dict(preparation)
    if interactive_main(kept):
        kept.pop("init_main_from_path", None)
    return kept


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


def needs_by_value(obj: Any, preparation: Mapping[str, Any]) -> list[str]:
    """What in ``obj`` must go to a worker by value (empty: nothing): when ``__main__`` is
    interactive (:func:`interactive_main`), the functions and classes of it that ``obj``
    uses."""
    return main_objects(obj) if interactive_main(preparation) else []


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


def dumps(obj: Any, *, by_value: bool, what: str, names: Sequence[str] = ()) -> bytes:
    """``obj`` pickled, by value through cloudpickle when ``by_value`` (``names``: what of an
    interactive ``__main__`` it uses, :func:`needs_by_value`); what cannot be pickled is a
    one-line :class:`~unirank.errors.ConfigError` naming ``what``."""
    module: Any = _cloudpickle(what, names) if by_value else pickle
    try:
        data: bytes = module.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # pickling raises many kinds
        raise ConfigError(
            f"{what} cannot be pickled ({type(exc).__name__}: {exc})",
            hint="use values that pickle (numbers, strings, tensors, dicts, state_dicts); "
                 "define functions and classes at module level or in a notebook cell") from None
    return data
