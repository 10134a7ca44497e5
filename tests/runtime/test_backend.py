"""Backend and device choice, and the backend registry (:mod:`unirank.runtime.backends`).

There is no GPU on this machine: the CUDA facts (available, visible device count, NCCL) are
simulated by passing :class:`CudaFacts` values, which is exactly what the pure functions take.
The only mock is the CUDA side of torch in :func:`test_nccl_init_sets_the_cuda_device_first`
(``torch.cuda.set_device`` and ``init_process_group`` recorded instead of run), because making a
GPU current needs a GPU. The registry tests register a dummy entry and unregister it afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from _procs import assert_snippet_runs
from unirank.errors import ConfigError
from unirank.runtime import backends
from unirank.runtime.backends import (
    Backend,
    CudaFacts,
    choose_backend,
    choose_device,
    cuda_facts,
)

NO_CUDA = CudaFacts(available=False, device_count=0, nccl_available=False)
CPU_BUILD_NCCL = CudaFacts(available=False, device_count=0, nccl_available=True)
ONE_GPU = CudaFacts(available=True, device_count=1, nccl_available=True)
FOUR_GPUS = CudaFacts(available=True, device_count=4, nccl_available=True)
GPUS_NO_NCCL = CudaFacts(available=True, device_count=4, nccl_available=False)


@pytest.mark.parametrize(
    ("requested", "facts", "local_world_size", "per_task", "expected"),
    [
        (None, NO_CUDA, 1, False, "gloo"),
        ("auto", NO_CUDA, 4, False, "gloo"),
        ("AUTO", CPU_BUILD_NCCL, 1, False, "gloo"),
        (None, FOUR_GPUS, 4, False, "nccl"),
        (None, FOUR_GPUS, 2, False, "nccl"),
        ("auto", FOUR_GPUS, 8, False, "gloo"),  # more ranks than GPUs on the node
        (None, ONE_GPU, 2, False, "gloo"),  # two ranks would share one GPU
        (None, ONE_GPU, 2, True, "nccl"),  # srun --gpus-per-task=1: one GPU each
        (None, ONE_GPU, 1, False, "nccl"),
        (None, GPUS_NO_NCCL, 1, False, "gloo"),
        ("gloo", FOUR_GPUS, 4, False, "gloo"),
        ("nccl", FOUR_GPUS, 8, False, "nccl"),  # explicit wins
        (" Gloo ", NO_CUDA, 1, False, "gloo"),
        ("mpi", NO_CUDA, 1, False, "mpi"),
        ("cpu:gloo,cuda:nccl", NO_CUDA, 1, False, "cpu:gloo,cuda:nccl"),
    ],
)
def test_choose_backend(
    requested: str | None, facts: CudaFacts, local_world_size: int, per_task: bool, expected: str
) -> None:
    got = choose_backend(
        requested, facts, local_world_size=local_world_size, per_task_gpus=per_task
    )
    assert got == expected


@pytest.mark.parametrize("facts", [NO_CUDA, CPU_BUILD_NCCL, GPUS_NO_NCCL])
def test_explicit_nccl_without_cuda_is_a_config_error(facts: CudaFacts) -> None:
    with pytest.raises(ConfigError) as info:
        choose_backend("nccl", facts)
    message = str(info.value)
    assert message.startswith("backend='nccl': the nccl backend")
    assert "HINT: use backend 'gloo'" in message
    assert "\n" not in message


def test_unknown_backend_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"backend='nlcc': is not a torch.distributed backend"):
        choose_backend("nlcc", FOUR_GPUS)


@pytest.mark.parametrize(
    ("local_rank", "facts", "expected"),
    [
        (0, NO_CUDA, "cpu"),
        (3, NO_CUDA, "cpu"),
        (0, ONE_GPU, "cuda:0"),
        (1, ONE_GPU, "cuda:0"),  # ignite #3259: one visible GPU is cuda:0 whatever the rank
        (7, ONE_GPU, "cuda:0"),
        (0, FOUR_GPUS, "cuda:0"),
        (3, FOUR_GPUS, "cuda:3"),
        (5, FOUR_GPUS, "cuda:1"),  # more ranks than GPUs: round-robin
        (2, CudaFacts(available=True, device_count=0, nccl_available=True), "cpu"),
    ],
)
def test_choose_device(local_rank: int, facts: CudaFacts, expected: str) -> None:
    assert choose_device(local_rank, facts) == expected


def test_cuda_facts_agree_with_torch() -> None:
    """The facts are read from real torch (on this CPU-only machine: no CUDA, gloo)."""
    import torch

    facts = cuda_facts()
    assert facts.available is torch.cuda.is_available()
    assert facts.device_count == (torch.cuda.device_count() if facts.available else 0)
    if not facts.available:
        assert choose_backend(None, facts) == "gloo"
        assert choose_device(0, facts) == "cpu"


# --- the registry --------------------------------------------------------------------------


def _never_called(**_: Any) -> None:
    raise AssertionError("the dummy backend was started")


def _nothing() -> None:
    return None


def _dummy(name: str = "dummy", **fields: Any) -> Backend:
    return Backend(name=name, init=_never_called, finalize=_nothing, **fields)


@pytest.fixture
def dummy() -> Iterator[Backend]:
    """A dummy entry (no module, no torch) registered for one test, then unregistered."""
    entry = backends.register(_dummy(aliases=("dmy",)))
    try:
        yield entry
    finally:
        backends.unregister("dummy")


def test_builtin_entries_are_registered_in_order() -> None:
    assert backends.names()[:2] == ("gloo", "nccl")
    assert backends.get("gloo").name == "gloo"
    assert backends.get(" NCCL ").name == "nccl"


def test_a_registered_entry_is_chosen_by_name_and_alias(dummy: Backend) -> None:
    assert "dummy" in backends.names()
    assert backends.choose_backend("dummy", NO_CUDA) == "dummy"
    assert backends.choose_backend("DMY", FOUR_GPUS) == "dummy"  # an alias gives the name
    assert backends.get("dmy") is dummy
    assert backends.find("dummy") is dummy
    assert backends.choose_backend(None, NO_CUDA) == "gloo"  # no auto_priority: never auto


def test_unregistering_forgets_name_and_aliases() -> None:
    entry = backends.register(_dummy(aliases=("dmy",)))
    assert backends.unregister("DMY") is entry
    assert "dummy" not in backends.names()
    assert backends.find("dummy") is None and backends.find("dmy") is None
    with pytest.raises(ConfigError):
        backends.choose_backend("dummy", NO_CUDA)


def test_unknown_backend_error_lists_the_registered_names(dummy: Backend) -> None:
    with pytest.raises(ConfigError) as info:
        backends.choose_backend("nlcc", FOUR_GPUS)
    message = str(info.value)
    assert message.startswith("backend='nlcc': is not a torch.distributed backend HINT:")
    for name in ("auto", *backends.names()):
        assert name in message.split("HINT:", 1)[1]
    assert "dummy" in message
    with pytest.raises(ConfigError, match="dummy"):
        backends.get("nlcc")


def test_an_explicit_entry_with_a_problem_is_a_config_error() -> None:
    backends.register(_dummy(problem=lambda facts: "needs a widget", problem_hint="buy one"))
    try:
        with pytest.raises(ConfigError) as info:
            backends.choose_backend("Dummy", NO_CUDA)
    finally:
        backends.unregister("dummy")
    assert str(info.value) == "backend='Dummy': the dummy backend needs a widget HINT: buy one"


def test_auto_tries_entries_by_priority() -> None:
    """A dummy entry above nccl is picked by auto where it applies, and skipped elsewhere."""

    def wide(facts: CudaFacts, *, local_world_size: int, per_task_gpus: bool) -> bool:
        return local_world_size >= 8

    backends.register(_dummy(auto_priority=1000, auto_applies=wide))
    try:
        assert backends.choose_backend(None, NO_CUDA, local_world_size=8) == "dummy"
        assert backends.choose_backend(None, FOUR_GPUS, local_world_size=4) == "nccl"
        assert backends.choose_backend(None, NO_CUDA, local_world_size=4) == "gloo"
        assert backends.choose_backend("gloo", NO_CUDA, local_world_size=8) == "gloo"
    finally:
        backends.unregister("dummy")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (_dummy("gloo"), "already taken"),
        (_dummy(aliases=("nccl",)), "already taken"),
        (_dummy("auto"), "not a usable backend name"),
        (_dummy("Dummy"), "not a usable backend name"),
        (_dummy("cpu:dummy"), "not a usable backend name"),
        (_dummy(aliases=("",)), "not a usable backend name"),
    ],
)
def test_register_refuses_taken_or_bad_names(entry: Backend, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        backends.register(entry)
    assert backends.names()[:2] == ("gloo", "nccl")
    assert "dummy" not in backends.names()


@pytest.mark.parametrize("name", ["mpi", "ucc", "xccl", "cpu:gloo,cuda:nccl"])
def test_other_torch_backends_get_a_plain_entry(name: str) -> None:
    entry = backends.get(name)
    assert entry.name == name
    assert entry.auto_priority is None
    assert entry.device(1, FOUR_GPUS) == "cuda:1"
    assert entry.current_device is None


def test_for_group_never_raises() -> None:
    """A user may make a group with any backend torch has; its entry is a plain one."""
    assert backends.for_group("nccl") is backends.get("nccl")
    assert backends.for_group("hccl").name == "hccl"


@pytest.mark.parametrize("name", ["gloo", "nccl"])
@pytest.mark.parametrize(
    ("local_rank", "facts", "expected"),
    [(1, NO_CUDA, "cpu"), (3, ONE_GPU, "cuda:0"), (5, FOUR_GPUS, "cuda:1")],
)
def test_every_builtin_entry_follows_the_device_rule(
    name: str, local_rank: int, facts: CudaFacts, expected: str
) -> None:
    assert backends.get(name).device(local_rank, facts) == expected


def test_nccl_init_sets_the_cuda_device_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mocked (making a GPU current needs a GPU): set_device, then init_process_group."""
    import torch
    import torch.distributed as dist

    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda dev: calls.append(("set_device", dev)))
    monkeypatch.setattr(
        dist, "init_process_group", lambda name, **kw: calls.append((name, kw["timeout"]))
    )
    backends.get("nccl").init(rank=0, world_size=2, store=object(), timeout=30.0, device="cuda:1")
    assert calls[0] == ("set_device", torch.device("cuda:1"))
    assert calls[1][0] == "nccl"
    assert calls[1][1].total_seconds() == 30.0


def test_gloo_init_on_cpu_does_not_touch_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    import torch.distributed as dist

    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda dev: calls.append(("set_device", dev)))
    monkeypatch.setattr(
        dist, "init_process_group", lambda name, **kw: calls.append((name, kw["timeout"]))
    )
    backends.get("gloo").init(rank=0, world_size=1, store=object(), timeout=None, device="cpu")
    assert calls == [("gloo", None)]


def test_backend_modules_do_not_import_torch() -> None:
    """The registry and the entries import torch only when an entry starts or stops a group.

    ``unirank.runtime`` itself imports torch, so a stub stands in for that package here.
    """
    import unirank

    runtime_dir = os.path.join(os.path.dirname(unirank.__file__), "runtime")
    code = (
        "import sys, types\n"
        "stub = types.ModuleType('unirank.runtime')\n"
        f"stub.__path__ = [{runtime_dir!r}]\n"
        "sys.modules['unirank.runtime'] = stub\n"
        "import unirank.runtime.backends as b\n"
        "assert b.choose_backend(None, b.CudaFacts(False, 0, False)) == 'gloo'\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    assert_snippet_runs(code)
