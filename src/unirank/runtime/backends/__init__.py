"""The backend registry: one :class:`Backend` entry per backend, one module per entry.

Each entry (see :class:`~unirank.runtime.backends.base.Backend`) says its name and aliases, when
``auto`` picks it, what makes it unusable when asked for explicitly, which device a rank uses, and
how to start and end its process group. The built-in entries are the ``BACKEND`` of each module
named in :data:`BUILTIN_MODULES`, registered in that order when this package is imported.

Adding a backend: write ``backends/<name>.py`` defining ``BACKEND = Backend(...)`` (importing
its library only inside ``init``/``finalize``), and add ``"<name>"`` to :data:`BUILTIN_MODULES`.
Code outside unirank may :func:`register` (and :func:`unregister`) entries at run time.

Choice (:func:`choose_backend`):

* ``None``/``"auto"``: an entry that names the launcher that started this process in its
  ``launchers`` (horovod under ``horovodrun``) when it can run here; else the registered
  entries with an ``auto_priority``, highest first; the first
  whose ``problem(facts)`` is ``None`` and whose ``auto_applies(...)`` holds. With the built-ins:
  ``"nccl"`` when CUDA and NCCL are available and nccl fits the node's layout
  (:func:`unirank.gpus.nccl_fits`: every local rank has a GPU of its own, as many visible GPUs as
  local ranks, or a launcher that binds GPUs per task), else ``"gloo"``;
  ``"horovod"`` under horovodrun. ``auto`` never picks ``"xla-tpu"``.
* A registered name or alias: that entry's name, or a
  :class:`~unirank.errors.ConfigError` naming ``backend`` when its ``problem(facts)`` is not
  ``None`` (``"nccl"`` without CUDA or NCCL).
* Another name torch.distributed knows (:data:`TORCH_BACKENDS`, or a per-device string with
  ``:`` such as ``"cpu:gloo,cuda:nccl"``): passed through as a plain torch.distributed entry.
* Anything else: a ConfigError listing the registered names.

Nothing here imports torch at module import time (only :func:`cuda_facts` and the entries'
``init``/``finalize``/``current_device`` do, when called). The registry reads no environment
variable: the caller passes ``per_task_gpus`` (:func:`unirank.gpus.gpus_bound_per_task`), and
:func:`cuda_facts` reads CUDA_VISIBLE_DEVICES through torch.
"""

from __future__ import annotations

import importlib

from unirank.errors import ConfigError
from unirank.runtime.backends.base import (
    AUTO,
    AutoRule,
    Backend,
    Collectives,
    InitFn,
    WrapLoader,
    WrapModel,
    WrapOptimizer,
    check_name,
    normalize,
    torch_backend,
)
from unirank.runtime.backends.facts import (
    CudaFacts,
    choose_device,
    cuda_facts,
)

__all__ = [
    "AUTO",
    "BUILTIN_MODULES",
    "KNOWN_BACKENDS",
    "TORCH_BACKENDS",
    "AutoRule",
    "Backend",
    "Collectives",
    "CudaFacts",
    "InitFn",
    "WrapLoader",
    "WrapModel",
    "WrapOptimizer",
    "choose_backend",
    "choose_device",
    "cuda_facts",
    "find",
    "for_group",
    "get",
    "names",
    "register",
    "unregister",
]

#: modules of this package whose ``BACKEND`` is registered on import, in this order
BUILTIN_MODULES = ("gloo", "nccl", "horovod", "xla")
#: other torch.distributed backends passed through by name, without an entry of their own
TORCH_BACKENDS = ("mpi", "ucc", "xccl")
#: backends torch.distributed knows by name (``"cpu:gloo,cuda:nccl"`` style strings also pass)
KNOWN_BACKENDS = ("gloo", "nccl", *TORCH_BACKENDS)

_ENTRIES: dict[str, Backend] = {}  # canonical name -> entry, in registration order
_NAMES: dict[str, str] = {}  # every name and alias -> canonical name


def register(entry: Backend) -> Backend:
    """Add ``entry`` to the registry and return it.

    Raises ValueError when its name or an alias is not a usable name (lower case, no spaces,
    commas or colons, not ``auto``) or is already taken by a registered entry.
    """
    claimed = (entry.name, *entry.aliases)
    for name in claimed:
        check_name(name)
    taken = sorted({name for name in claimed if name in _NAMES or claimed.count(name) > 1})
    if taken:
        raise ValueError(
            f"backend entry {entry.name!r}: name(s) {', '.join(map(repr, taken))} already taken"
        )
    _ENTRIES[entry.name] = entry
    for name in claimed:
        _NAMES[name] = entry.name
    return entry


def unregister(name: str) -> Backend:
    """Remove the entry called ``name`` (or one of its aliases) and return it (KeyError if none)."""
    canonical = _NAMES[normalize(name)]
    entry = _ENTRIES.pop(canonical)
    for claimed in (entry.name, *entry.aliases):
        _NAMES.pop(claimed, None)
    return entry


def names() -> tuple[str, ...]:
    """The canonical names of the registered entries, in registration order."""
    return tuple(_ENTRIES)


def find(name: str) -> Backend | None:
    """The registered entry called ``name`` or with that alias (any case), else ``None``."""
    canonical = _NAMES.get(normalize(name))
    return None if canonical is None else _ENTRIES[canonical]


def _passes_through(name: str) -> bool:
    return name in KNOWN_BACKENDS or ":" in name


def _unknown(requested: str | None) -> ConfigError:
    return ConfigError(
        "is not a torch.distributed backend",
        variable="backend",
        value=requested,
        hint=f"use one of: {', '.join((AUTO, *names()))} "
        f"(or a torch.distributed backend: {', '.join(TORCH_BACKENDS)})",
    )


def get(name: str) -> Backend:
    """The entry for backend ``name``: a registered one (by name or alias, any case), or a plain
    torch.distributed entry for another name torch knows (see :func:`choose_backend`).

    Raises ConfigError (naming ``backend``) for an unknown name. Does not check ``problem``.
    """
    entry = find(name)
    if entry is not None:
        return entry
    if _passes_through(normalize(name)):
        return torch_backend(normalize(name))
    raise _unknown(name)


def for_group(name: str) -> Backend:
    """The entry for a live process group whose backend torch reports as ``name``: a registered
    entry, else a plain torch.distributed entry (never raises: a user may create a group with
    any backend torch has)."""
    return find(name) or torch_backend(name)


def _auto_order() -> list[Backend]:
    """The entries ``auto`` may pick, highest ``auto_priority`` first (ties: registration order)."""
    eligible = [entry for entry in _ENTRIES.values() if entry.auto_priority is not None]
    return sorted(eligible, key=lambda entry: -(entry.auto_priority or 0))


def choose_backend(
    requested: str | None,
    facts: CudaFacts,
    *,
    local_world_size: int = 1,
    per_task_gpus: bool = False,
    launcher: str | None = None,
) -> str:
    """The backend name for ``requested`` (``None``/``"auto"``/a backend name).

    ``facts`` are the CUDA facts of this process (simulated in tests); ``local_world_size`` the
    number of ranks on this node; ``per_task_gpus`` whether the launcher bound GPUs per task
    (see :func:`unirank.gpus.gpus_bound_per_task`); ``launcher`` the launcher that started this
    process (an entry that names it in ``launchers`` wins ``auto``). Raises ConfigError for an
    unusable explicit choice or an unknown name. Rules: see this module's docstring.
    """
    name = AUTO if requested is None else normalize(requested)
    if name == AUTO:
        for candidate in _ENTRIES.values():
            if launcher in candidate.launchers and candidate.problem(facts) is None:
                return candidate.name
        for candidate in _auto_order():
            if candidate.problem(facts) is None and candidate.auto_applies(
                facts, local_world_size=local_world_size, per_task_gpus=per_task_gpus
            ):
                return candidate.name
        raise ConfigError(
            "no registered backend that auto may pick can run here",
            variable="backend",
            value=requested,
            hint=f"name one of: {', '.join(names())}",
        )
    entry = find(name)
    if entry is not None:
        problem = entry.problem(facts)
        if problem is not None:
            raise ConfigError(
                f"the {entry.name} backend {problem}",
                variable="backend",
                value=requested,
                hint=entry.problem_hint,
            )
        return entry.name
    if _passes_through(name):
        return name
    raise _unknown(requested)


def _register_builtins() -> None:
    for module_name in BUILTIN_MODULES:
        module = importlib.import_module(f"{__name__}.{module_name}")
        entry = getattr(module, "BACKEND", None)
        if not isinstance(entry, Backend):
            raise TypeError(f"{module.__name__}.BACKEND is not a Backend entry")
        register(entry)


_register_builtins()
