"""A pytest plugin that points ``ignite.distributed`` at unirank for ignite's own tests.

Loaded with ``-p unirank_shim`` (this folder on ``sys.path``), before any conftest imports
``ignite.distributed``. It imports ignite whole first, so that ignite's other packages
(``ignite.engine``, ...) keep the ``ignite.distributed`` they were built with, then replaces, in
``sys.modules`` and as attributes of their parents:

- ``ignite.distributed`` and the submodules whose public names are ignite's API
  (``ignite.distributed.utils``, ``.auto``, ``.launcher``) by modules whose public names
  (no leading underscore) are unirank's: ``ignite.distributed.utils.all_gather`` is
  ``unirank.all_gather``. A public name unirank lacks is an ``AttributeError`` (an
  ``ImportError`` for ``from ... import``), never ignite's object;
- their private names stay ignite's (``_SerialModel``, ``_rank_not_in_group``...), so that the
  test modules import, with two exceptions that serve ignite's test fixtures:
  ``ignite.distributed.utils._model`` is a read-only view of unirank's getters (the fixtures'
  ``_sanity_check`` then checks unirank's numbers; ignite's other private methods and
  attributes are absent from it), and ``_set_model`` does nothing (ignite's fixtures call it to
  drop ignite's cached context; unirank reads the live one). ``ignite.distributed.comp_models``
  stays ignite's (it holds only private classes).

Tests that need ignite's private internals therefore fail under the shim; the project's harness
(tests/runtime/test_ignite_suite.py) lists them as not applicable, with the reason.

Environment variables read: none.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

import ignite
import ignite.distributed as _real_idist

import unirank

#: the shimmed modules: name -> ignite's real module (its private names stay ignite's)
SHIMMED = ("ignite.distributed.utils", "ignite.distributed.auto", "ignite.distributed.launcher")


class _UnirankModelView:
    """The part of ignite's private ``_model`` that ignite's test helpers read for their sanity
    check, answered by unirank's getters."""

    def get_rank(self) -> int:
        return int(unirank.get_rank())

    def get_world_size(self) -> int:
        return int(unirank.get_world_size())

    def get_local_rank(self) -> int:
        return int(unirank.get_local_rank())

    def get_nproc_per_node(self) -> int:
        return int(unirank.get_nproc_per_node())

    def get_node_rank(self) -> int:
        return int(unirank.get_node_rank())

    def get_nnodes(self) -> int:
        return int(unirank.get_nnodes())


def _set_model(model: Any) -> None:
    """ignite's fixtures drop ignite's cached context with this; unirank has none to drop."""


#: private names of ``ignite.distributed.utils`` served by the shim instead of ignite
_PRIVATE_OVERRIDES: dict[str, dict[str, Any]] = {
    "ignite.distributed.utils": {"_model": _UnirankModelView(), "_set_model": _set_model},
}


class _ShimModule(types.ModuleType):
    """A module whose public names are unirank's and whose private names are ``real``'s."""

    def __init__(self, name: str, real: types.ModuleType, children: dict[str, Any]) -> None:
        super().__init__(name, f"{name}, served by unirank (tests/ignite_suite/unirank_shim.py)")
        self.__dict__["_shim_real"] = real
        self.__dict__["_shim_children"] = children
        self.__dict__["_shim_private"] = _PRIVATE_OVERRIDES.get(name, {})
        self.__dict__["__path__"] = list(getattr(real, "__path__", []))
        self.__dict__["__file__"] = getattr(real, "__file__", None)

    def __getattr__(self, name: str) -> Any:
        children = self.__dict__["_shim_children"]
        if name in children:
            return children[name]
        private = self.__dict__["_shim_private"]
        if name in private:
            return private[name]
        if name.startswith("_"):
            return getattr(self.__dict__["_shim_real"], name)
        try:
            return getattr(unirank, name)
        except AttributeError:
            where = f"{self.__name__}.{name}"
            raise AttributeError(f"unirank has no {name!r} (ignite's {where})") from None


def install() -> None:
    """Swap ``ignite.distributed`` and its API submodules for unirank-backed ones."""
    reals = {name: importlib.import_module(name) for name in SHIMMED}
    importlib.import_module("ignite.distributed.comp_models")
    subs = {name: _ShimModule(name, real, {}) for name, real in reals.items()}
    children: dict[str, Any] = {name.rsplit(".", 1)[1]: mod for name, mod in subs.items()}
    children["comp_models"] = sys.modules["ignite.distributed.comp_models"]
    top = _ShimModule("ignite.distributed", _real_idist, children)
    sys.modules["ignite.distributed"] = top
    sys.modules.update(subs)
    ignite.distributed = top  # type: ignore[attr-defined]


install()


def pytest_report_header() -> str:
    """Say, at the top of the run, which ``ignite.distributed`` the tests get."""
    return f"ignite.distributed -> unirank ({unirank.__file__})"
