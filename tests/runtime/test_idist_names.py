"""Every public name of the installed ``ignite.distributed`` is a name of ``unirank``, and takes
ignite's arguments. A new ignite release that adds a name (or a module) fails here until unirank
has it, or it joins one of the documented exclusions below (see docs/ignite.md)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from types import ModuleType
from typing import Any

import unirank
from _procs import unavailable

#: ignite's implementation modules, reachable as attributes of ignite.distributed; not API
NOT_PROVIDED_MODULES = {"auto", "comp_models", "launcher", "native", "utils", "xla"}
#: public names deliberately not provided, with the reason (docs/ignite.md says the same)
NOT_PROVIDED = {
    "registered_computation_models": "a tuple of ignite's private computation-model classes",
}
#: parameters whose position differs (keyword use is the same), with the reason
POSITION_DIFFERS = {
    ("Parallel", "init_method"): "unirank's 7th argument is init_timeout; ignite's options follow",
}

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _ignite() -> ModuleType:
    if importlib.util.find_spec("ignite") is None:
        unavailable("pytorch-ignite is not installed (pip install -e '.[test]')")
    return importlib.import_module("ignite.distributed")


def _public(module: ModuleType) -> dict[str, Any]:
    return {name: getattr(module, name) for name in dir(module) if not name.startswith("_")}


def test_every_public_name_of_ignite_distributed_is_in_unirank() -> None:
    names = _public(_ignite())
    modules = {name for name, value in names.items() if inspect.ismodule(value)}
    assert modules == NOT_PROVIDED_MODULES, "a module of ignite.distributed came or went"
    assert set(NOT_PROVIDED) <= set(names), "an excluded name is gone from ignite: drop it here"
    wanted = set(names) - modules - set(NOT_PROVIDED)
    missing = sorted(name for name in wanted if not hasattr(unirank, name))
    assert missing == []
    assert wanted <= set(unirank.__all__) and wanted <= set(dir(unirank))


def test_the_flags_are_bools_that_agree_with_ignite() -> None:
    ignite = _ignite()
    for name in ("has_native_dist_support", "has_hvd_support", "has_xla_support"):
        assert getattr(unirank, name) is getattr(ignite, name), name


def _accepts(ours: inspect.Signature, name: str, position: int | None) -> bool:
    params = list(ours.parameters.values())
    by_name = ours.parameters.get(name)
    if by_name is None:
        return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    if position is None or by_name.kind not in _POSITIONAL:
        return position is None
    return params.index(by_name) == position


def test_every_callable_takes_ignite_s_arguments_by_name_and_position() -> None:
    names = _public(_ignite())
    wrong: list[str] = []
    for name, theirs in sorted(names.items()):
        if not callable(theirs) or inspect.ismodule(theirs) or name in NOT_PROVIDED:
            continue
        ours = inspect.signature(getattr(unirank, name))
        for index, param in enumerate(inspect.signature(theirs).parameters.values()):
            if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                continue
            position = index if param.kind in _POSITIONAL else None
            if (name, param.name) in POSITION_DIFFERS:
                position = None
            if not _accepts(ours, param.name, position):
                wrong.append(f"{name}({param.name}) at {position}: unirank has {ours}")
    assert wrong == []


def test_get_nproc_per_node_is_unirank_s_local_world_size() -> None:
    """An alias, not a second rule."""
    assert unirank.get_nproc_per_node is unirank.get_local_world_size
