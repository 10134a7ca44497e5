"""Points ``ignite.distributed`` at unirank for ignite's own tests, in every process they start.

:func:`register` (run at interpreter start by the ``.pth`` line that
tests/runtime/test_ignite_suite.py writes into the user site folder of its unirank runs, so that
it reaches the pytest process, its xdist ranks, and the processes ignite's tests start with
``subprocess``, torchrun, ``Parallel`` or ``spawn``) makes :func:`install` run as soon as ``ignite``
has been imported, before the importer sees it. ignite is imported whole first, so that ignite's
other packages (``ignite.engine``, ``ignite.metrics``...) keep the ``ignite.distributed`` they were
built with; then :func:`install` replaces, in ``sys.modules`` and as attributes of their parents:

- ``ignite.distributed`` and the submodules whose public names are ignite's API
  (``ignite.distributed.utils``, ``.auto``, ``.launcher``) by modules whose public names
  (no leading underscore) are unirank's: ``ignite.distributed.utils.all_gather`` is
  ``unirank.all_gather``. A public name unirank lacks is an ``AttributeError`` (an
  ``ImportError`` for ``from ... import``), never ignite's object;
- their private names stay ignite's (``_SerialModel``, ``_rank_not_in_group``...), so that the
  test modules import, with two exceptions that serve ignite's test fixtures:
  ``ignite.distributed.utils._model`` is a read-only view of unirank's getters (the helpers'
  ``_sanity_check`` then checks unirank's numbers; ignite's other private methods and
  attributes are absent from it), and ``_set_model`` does nothing (ignite's fixtures call it to
  drop ignite's cached context; unirank reads the live one). ``ignite.distributed.comp_models``
  stays ignite's (it holds only private classes).

Tests that need ignite's private internals therefore fail under the shim; the project's harness
lists them as not applicable, with the reason.

As a pytest plugin (``-p unirank_shim``), the module also sets messages aside: unirank promises
ignite's exception and warning types, not its wording, so ``pytest.raises(..., match=...)`` and
``pytest.warns(..., match=...)`` check the type only in the processes running the tests, and the
report header says which ``ignite.distributed`` the tests get.

Environment variables read: none.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any


def _unirank() -> types.ModuleType:
    """unirank (imported on first use, after ``ignite``)."""
    return importlib.import_module("unirank")


#: the shimmed modules: name -> ignite's real module (its private names stay ignite's)
SHIMMED = ("ignite.distributed.utils", "ignite.distributed.auto", "ignite.distributed.launcher")


class _UnirankModelView:
    """The part of ignite's private ``_model`` that ignite's test helpers read for their sanity
    check, answered by unirank's getters."""

    def get_rank(self) -> int:
        return int(_unirank().get_rank())

    def get_world_size(self) -> int:
        return int(_unirank().get_world_size())

    def get_local_rank(self) -> int:
        return int(_unirank().get_local_rank())

    def get_nproc_per_node(self) -> int:
        return int(_unirank().get_nproc_per_node())

    def get_node_rank(self) -> int:
        return int(_unirank().get_node_rank())

    def get_nnodes(self) -> int:
        return int(_unirank().get_nnodes())


def _set_model(model: Any) -> None:
    """ignite's fixtures drop ignite's cached context with this; unirank has none to drop."""


def _rank_not_in_group(group: Any) -> bool:
    """ignite's private helper, answered for unirank's groups: True on a rank outside the
    ``torch.distributed`` group ``group`` (a list of ranks is made a group first, as ignite does);
    False without a group, or for a backend without torch.distributed groups."""
    import torch.distributed as dist

    if group is None or not dist.is_initialized():
        return False
    if isinstance(group, list) and all(isinstance(item, int) for item in group):
        group = _unirank().new_group(group)
    if not isinstance(group, dist.ProcessGroup) and group is not dist.GroupMember.NON_GROUP_MEMBER:
        return False
    return bool(dist._rank_not_in_group(group))


#: private names of ``ignite.distributed.utils`` served by the shim instead of ignite
_PRIVATE_OVERRIDES: dict[str, dict[str, Any]] = {
    "ignite.distributed.utils": {"_model": _UnirankModelView(), "_set_model": _set_model,
                                 "_rank_not_in_group": _rank_not_in_group},
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
            return getattr(_unirank(), name)
        except AttributeError:
            where = f"{self.__name__}.{name}"
            raise AttributeError(f"unirank has no {name!r} (ignite's {where})") from None


def install() -> None:
    """Swap ``ignite.distributed`` and its API submodules for unirank-backed ones."""
    import ignite

    real_idist = importlib.import_module("ignite.distributed")
    reals = {name: importlib.import_module(name) for name in SHIMMED}
    importlib.import_module("ignite.distributed.comp_models")
    subs = {name: _ShimModule(name, real, {}) for name, real in reals.items()}
    children: dict[str, Any] = {name.rsplit(".", 1)[1]: mod for name, mod in subs.items()}
    children["comp_models"] = sys.modules["ignite.distributed.comp_models"]
    top = _ShimModule("ignite.distributed", real_idist, children)
    sys.modules["ignite.distributed"] = top
    sys.modules.update(subs)
    ignite.distributed = top  # type: ignore[attr-defined]


class _InstallAfter(importlib.abc.Loader):
    """ignite's own loader, then :func:`install`."""

    def __init__(self, real: importlib.abc.Loader) -> None:
        self.real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.real.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.real.exec_module(module)
        install()


class _IgniteFinder(importlib.abc.MetaPathFinder):
    """Finds ``ignite`` as the other finders do, with :class:`_InstallAfter` as its loader."""

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != "ignite":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _InstallAfter(spec.loader)
        return spec


def register() -> None:
    """Make the first ``import ignite`` of this process end with :func:`install` (at once when
    ignite is already imported)."""
    if "ignite" in sys.modules:
        install()
    elif not any(isinstance(f, _IgniteFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _IgniteFinder())


def _type_only(check: Callable[..., Any]) -> Callable[..., Any]:
    """``pytest.raises``/``pytest.warns`` without their ``match=`` (messages aside)."""

    @functools.wraps(check)
    def checked(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("match", None)
        return check(*args, **kwargs)

    return checked


def pytest_configure(config: Any) -> None:
    """Set messages aside for the tests of this pytest process."""
    import pytest

    pytest.raises = _type_only(pytest.raises)
    pytest.warns = _type_only(pytest.warns)


def pytest_report_header() -> str:
    """Say, at the top of the run, which ``ignite.distributed`` the tests get."""
    shimmed = isinstance(sys.modules.get("ignite.distributed"), _ShimModule)
    return f"ignite.distributed -> unirank ({_unirank().__file__}): {shimmed}"
