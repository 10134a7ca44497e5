"""The names of pytorch-ignite's ``ignite.distributed`` (0.5) that unirank's runtime does not
already have under the same name, as thin names over it: ``import unirank as idist`` runs an
idist program unchanged (see docs/ignite.md for the few places where the meaning differs).

* :func:`initialize` / :func:`spawn` start the backend through
  :func:`~unirank.runtime.lifecycle.init` and :class:`~unirank.runtime.parallel.Parallel`;
* :func:`model_name`, :func:`available_backends` and the ``has_*_support`` flags answer from the
  backend registry (:mod:`unirank.runtime.backends`);
* :func:`get_nproc_per_node` is :func:`~unirank.runtime.state.get_local_world_size`;
* :func:`show_config` logs ignite's lines, then the launcher and where each number came from;
* :func:`set_local_rank` (deprecated) and :func:`sync` (nothing to do: the getters read the live
  context on every call) are accepted;
* :func:`all_gather_tensors_with_shapes` pads, gathers with
  :func:`~unirank.runtime.collectives.all_gather`, and cuts each rank's tensor back out.

:func:`~unirank.runtime.groups.new_group` and the ``group=`` / ``safe_mode=`` arguments of the
collectives live in :mod:`.groups` and :mod:`.collectives`.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from unirank.errors import ConfigError
from unirank.runtime import backends, groups, ignite_options, lifecycle, state
from unirank.runtime.collectives import all_gather
from unirank.runtime.helpers import ignite_logger
from unirank.runtime.parallel import Parallel

__all__ = [
    "all_gather_tensors_with_shapes",
    "available_backends",
    "get_nproc_per_node",
    "has_hvd_support",
    "has_native_dist_support",
    "has_xla_support",
    "initialize",
    "model_name",
    "set_local_rank",
    "show_config",
    "spawn",
    "sync",
]

#: ignite's names of its computation models, by the backend that runs them
SERIAL = "serial"
NATIVE = "native-dist"
MODEL_NAMES = {"horovod": "horovod-dist", "xla-tpu": "xla-dist"}
#: the logger show_config writes to (ignite's name for it)
LOGGER_NAME = "ignite.distributed.utils"

get_nproc_per_node = state.get_local_world_size


#: whether torch.distributed can be used by this Python
has_native_dist_support: bool = dist.is_available()
#: the flags answered on first use (no CUDA query at import), by the registry entry they ask
LAZY_FLAGS = {"has_hvd_support": "horovod", "has_xla_support": "xla-tpu"}
has_hvd_support: bool  # served by __getattr__ below
has_xla_support: bool  # served by __getattr__ below


@functools.cache
def _usable(name: str) -> bool:
    """True when the registry's entry ``name`` can start here (its ``problem`` says nothing).
    Reads: CUDA_VISIBLE_DEVICES (through torch)."""
    return backends.get(name).problem(backends.cuda_facts()) is None


def __getattr__(name: str) -> Any:
    """``has_hvd_support`` (Horovod is usable here) and ``has_xla_support`` (torch_xla is)."""
    if name in LAZY_FLAGS:
        return _usable(LAZY_FLAGS[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def available_backends() -> tuple[str, ...]:
    """The backends that can start here: the registry's entries without a ``problem`` (in
    registration order), then torch.distributed's other backends this torch build has.

    Reads: CUDA_VISIBLE_DEVICES (through torch).
    """
    facts = backends.cuda_facts()
    usable = [name for name in backends.names() if backends.get(name).problem(facts) is None]
    built = [name for name in backends.TORCH_BACKENDS
             if getattr(dist, f"is_{name}_available", lambda: False)()]
    return (*usable, *built)


def model_name() -> str:
    """ignite's name of the live configuration: ``serial`` without a backend, ``horovod-dist``,
    ``xla-dist``, or ``native-dist`` for a torch.distributed process group."""
    name = state.backend()
    if name is None:
        return SERIAL
    return MODEL_NAMES.get(name, NATIVE)


def initialize(backend: str, **kwargs: Any) -> None:
    """ignite's ``initialize``: start ``backend`` (``"gloo"``, ``"nccl"``, ``"horovod"``,
    ``"xla-tpu"``...) for this process's launcher, through :func:`unirank.runtime.init`.

    ``kwargs``: ``timeout`` (timedelta or seconds; unirank's init timeout), ``init_method``
    (``None`` or ``"env://"``), ``rank`` and ``world_size`` (checked against the launcher's).
    Reads: every variable :func:`unirank.runtime.init` reads.
    """
    options = dict(kwargs)
    method = options.pop("init_method", None)
    ignite_options.init_method(method)  # a refused one fails before anything starts
    env = state.dist_env()
    for field in ("rank", "world_size"):
        given = options.pop(field, None)
        if given is not None and int(given) != getattr(env, field):
            raise ConfigError(
                f"disagrees with the {env.launcher} launcher's {field} {getattr(env, field)}",
                variable=field,
                value=str(given),
                hint=f"leave {field} out: unirank takes it from the launcher",
            )
    lifecycle.init(backend, init_method=method,
                   timeout=ignite_options.take_init_timeout(options, "initialize"))


def spawn(
    backend: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs_dict: Mapping[str, Any] | None = None,
    nproc_per_node: int = 1,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
    **kwargs: Any,
) -> None:
    """ignite's ``spawn``: ``fn(local_rank, *args, **kwargs_dict)`` on ``nproc_per_node``
    workers of this node, each with ``backend`` started, through unirank's one engine
    (:class:`~unirank.runtime.parallel.Parallel`; under a launcher that already placed several
    processes here, it runs in place as ``Parallel`` does).

    ``kwargs``: ``timeout``, ``init_method`` (see :func:`initialize`), ``start_method``,
    ``join``, ``daemon``. Reads: what :class:`~unirank.runtime.parallel.Parallel` reads.
    """
    options = dict(kwargs)
    method = options.pop("init_method", None)
    ignite_options.take_spawn_options(options)
    timeout = ignite_options.take_init_timeout(options, "spawn")
    backends.choose_backend(backend, backends.cuda_facts())  # an unusable backend fails here
    ignite: dict[str, Any] = {} if timeout is None else {"timeout": timeout}  # errors say so
    runner = Parallel(backend, nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank,
                      master_addr=master_addr, master_port=master_port, init_method=method,
                      **ignite)
    runner.run(fn, *args, **dict(kwargs_dict or {}))


def sync(temporary: bool = False) -> None:
    """Accepted for ignite's programs; there is nothing to do: every getter reads the live
    context (the process group, the launcher) when it is called."""


def set_local_rank(index: int) -> None:
    """Deprecated (as in ignite): the local rank comes from the launcher. ``index`` is used only
    where no launcher gives one: with no launcher detected, and for a group made by hand
    without ``LOCAL_RANK``. Warns with DeprecationWarning either way."""
    warnings.warn("set_local_rank is deprecated: unirank reads the local rank from the launcher "
                  "(it is used only when no launcher gives one)",
                  DeprecationWarning, stacklevel=2)
    state.STATE.local_rank_hint = int(index)


def _config_lines() -> list[str]:
    """ignite's show_config lines, then the launcher and the source of each number."""
    lines = [
        f"distributed configuration: {model_name()}",
        f"backend: {state.backend()}",
        f"device: {state.device().type}",
        f"hostname: {state.hostname()}",
        f"world size: {state.get_world_size()}",
        f"rank: {state.get_rank()}",
        f"local rank: {state.get_local_rank()}",
        f"num processes per_node: {get_nproc_per_node()}",
        f"num nodes: {state.get_nnodes()}",
        f"node rank: {state.get_node_rank()}",
    ]
    from unirank.launchers import explain

    env = state.dist_env()
    why = next((c.reason for c in explain() if c.status == "chosen" and c.name == env.launcher),
               "")
    lines.append(f"launcher: {env.launcher}" + (f" ({why})" if why else ""))
    labels = {"world_size": "world size", "rank": "rank", "local_rank": "local rank",
              "local_world_size": "num processes per_node", "num_nodes": "num nodes",
              "node_rank": "node rank", "master_addr": "master address",
              "master_port": "master port"}
    for field, label in labels.items():
        lines.append(f"{label} from: {env.sources.get(field, 'default')}")
    return lines


def show_config() -> None:
    """Log the configuration as ignite does (logger ``ignite.distributed.utils``, rank 0 only,
    ignite's format): ignite's lines, then unirank's launcher and where each number came from.

    Reads: the launcher's variables (through :func:`unirank.launchers.explain`).
    """
    logger = ignite_logger(LOGGER_NAME)
    for line in _config_lines():
        logger.info(line)


def all_gather_tensors_with_shapes(
    tensor: torch.Tensor, shapes: Sequence[Sequence[int]], group: Any = None
) -> list[torch.Tensor]:
    """Every rank's ``tensor`` when their shapes differ (same number of dimensions):
    ``shapes[i]`` is rank ``i``'s shape (of the group's ``i``-th rank with ``group``). A rank
    outside ``group`` gets ``[tensor]``."""
    group = groups.resolve(group)
    if groups.not_member(group):
        return [tensor]
    largest = torch.tensor(shapes).amax(dim=0).tolist()
    padding: list[int] = []
    for size, own in reversed(list(zip(largest, tensor.shape))):
        padding += [0, int(size) - int(own)]
    padded = torch.nn.functional.pad(tensor, tuple(padding))
    gathered: torch.Tensor = all_gather(padded, group)
    step = int(largest[0]) if largest else 1
    chunks = [gathered[start:start + step] for start in range(0, max(len(gathered), 1), step)]
    return [chunk[tuple(slice(0, int(size)) for size in shape)]
            for chunk, shape in zip(chunks, shapes)]
