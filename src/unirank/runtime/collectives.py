"""Collectives that also work at world size 1 and before (or without) a process group.

* :func:`all_reduce` reduces a tensor in place (and returns it) or a number (returns the result);
  ops ``SUM``, ``MEAN`` (alias ``AVERAGE``), ``MIN``, ``MAX``, ``PRODUCT``, and the bitwise
  ``AND``/``OR`` of integer tensors (strings, any case, or ``dist.ReduceOp``).
* :func:`all_gather` of a tensor concatenates along dim 0 (0-d tensors are stacked); of anything
  else (number, str, picklable object) returns the list of every rank's value, in rank order.
* :func:`broadcast` of a tensor fills it in place from ``src``; of anything else picklable (a
  number, ``str``, ``pathlib.Path``, dict, list, an object of the program's own class) returns
  ``src``'s value (the other ranks' values are ignored), as :func:`all_gather` takes any
  picklable object (ignite's ``broadcast`` refuses the types past ``pathlib.Path`` with a
  TypeError). ``safe_mode=True`` lets the other ranks pass anything (``None``) even when
  ``src`` broadcasts a tensor.

Objects and strings travel pickled in byte tensors (:mod:`unirank.runtime.objects`): no
collective needs numpy.
* :func:`barrier`.

``group`` (ignite's meaning): ``None`` for every rank, a process group, or a list of global ranks
(see :mod:`unirank.runtime.groups`); a rank outside the group gets its own data back.
Without a process group every call returns at once with this process's own data. When the live
backend is not a torch.distributed group (Horovod, XLA), its entry's
:class:`~unirank.runtime.backends.Collectives` do the work; they have no sub-groups, so a
``group`` other than ``None`` is a ValueError there, and so are the bitwise ops.
"""

from __future__ import annotations

import warnings
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist

from unirank.runtime import backends, groups, objects, state

__all__ = ["REDUCE_OPS", "all_gather", "all_reduce", "barrier", "broadcast"]

T = TypeVar("T")

_SUM = "SUM"
_Tensor = torch.Tensor
_is_initialized = dist.is_initialized
_dist_all_reduce = dist.all_reduce

#: the reduce operations by name
REDUCE_OPS: dict[str, Any] = {
    "SUM": dist.ReduceOp.SUM,
    "MEAN": None,  # SUM then divide (gloo has no AVG)
    "MIN": dist.ReduceOp.MIN,
    "MAX": dist.ReduceOp.MAX,
    "PRODUCT": dist.ReduceOp.PRODUCT,
    "AND": dist.ReduceOp.BAND,
    "OR": dist.ReduceOp.BOR,
}
_OP_ALIASES = {"AVG": "MEAN", "AVERAGE": "MEAN", "PROD": "PRODUCT", "BAND": "AND", "BOR": "OR"}
#: the ops the backends that are not a torch.distributed group (Horovod, XLA) do not have
_TORCH_ONLY_OPS = ("AND", "OR")


def _op_name(op: Any) -> str:
    if isinstance(op, str):
        name = op.strip().upper()
        name = _OP_ALIASES.get(name, name)
        if name in REDUCE_OPS:
            return name
    else:
        for name, value in REDUCE_OPS.items():
            if value is not None and op == value:
                return name
        if op == dist.ReduceOp.AVG:
            return "MEAN"
    raise ValueError(f"Unsupported reduction operation: unknown reduce op {op!r}: use one of "
                     f"{', '.join(REDUCE_OPS)}")


def _active() -> bool:
    """True when a process group is there to talk to (the default one exists)."""
    return state.is_initialized()


def _own(group: Any) -> backends.Collectives | None:
    """The live backend's own collectives (Horovod, XLA), or None for torch.distributed."""
    active = state.active()
    if active is None or active.collectives is None:
        return None
    if group is not None:
        raise ValueError(
            f"the {active.name} backend has no torch.distributed process groups: pass group=None"
        )
    return active.collectives


def _reduce_tensor(tensor: torch.Tensor, name: str, group: Any) -> torch.Tensor:
    """Reduce in place on the live backend (a MEAN tensor's dtype was checked by the caller)."""
    own = _own(group)
    if own is not None:
        if name in _TORCH_ONLY_OPS:
            raise ValueError(f"the {state.backend()} backend has no {name} reduction")
        result: torch.Tensor = own.all_reduce(tensor, name)
        return result
    if name == "MEAN":
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        tensor.div_(dist.get_world_size(group))
    else:
        dist.all_reduce(tensor, op=REDUCE_OPS[name], group=group)
    return tensor


def all_reduce(tensor: Any, op: Any = _SUM, group: Any = None) -> Any:
    """Reduce ``tensor`` (a tensor, in place, returned) or a number (the result is returned).

    A number becomes a tensor on :func:`~unirank.runtime.state.device`; ``int`` results stay
    ``int`` except for ``MEAN``, which always gives a ``float``. Unknown ops raise ValueError.
    ``group``: see this module's docstring; a rank outside it gets ``tensor`` back unchanged.
    """
    # fast path: the common call costs three checks more than dist.all_reduce
    if group is None and tensor.__class__ is _Tensor and op is _SUM and _is_initialized():
        _dist_all_reduce(tensor)
        return tensor
    if not _active():
        return _serial_all_reduce(tensor, op)
    name = _op_name(op)
    group = groups.resolve(group)
    if groups.not_member(group):
        return tensor
    if isinstance(tensor, torch.Tensor):
        _check_mean(tensor, name)
        return _reduce_tensor(tensor, name, group)
    if isinstance(tensor, (bool, int, float)):
        is_int = isinstance(tensor, int) and name != "MEAN"
        dtype = torch.int64 if is_int else torch.float64
        value = torch.tensor([tensor], dtype=dtype, device=state.device())
        _reduce_tensor(value, name, group)
        result = value.item()
        return int(result) if is_int else float(result)
    raise TypeError(f"Unhandled input type {type(tensor)}: all_reduce takes a tensor or a number")


def _check_mean(tensor: torch.Tensor, name: str) -> None:
    if name == "MEAN" and not (tensor.is_floating_point() or tensor.is_complex()):
        raise TypeError(
            f"all_reduce MEAN needs a floating-point tensor, got {tensor.dtype}; "
            "convert it first (tensor.float())"
        )


def _serial_all_reduce(tensor: Any, op: Any) -> Any:
    """Without a group, ignite's answer: the input back unchanged (a number reduced with ``MEAN``
    becomes a ``float``). An op or a type that a group would refuse gives a warning, not an
    error, as ignite returns those inputs too."""
    try:
        name = _op_name(op)
    except ValueError as exc:
        warnings.warn(f"{exc}; without a process group the input is returned unchanged",
                      stacklevel=3)
        return tensor
    if isinstance(tensor, torch.Tensor):
        _check_mean(tensor, name)
        return tensor
    if isinstance(tensor, (bool, int, float)):
        return float(tensor) if name == "MEAN" else tensor
    warnings.warn(f"Unhandled input type {type(tensor)}: all_reduce takes a tensor or a number; "
                  "without a process group the input is returned unchanged", stacklevel=3)
    return tensor


def _gather_numbers(data: Any, group: Any) -> Any:
    """Every member's number, as ignite gathers them: through a 1-element tensor (``float64``
    for a float, torch's default type for the others), back as Python numbers."""
    dtype = torch.float64 if isinstance(data, float) else None
    values: torch.Tensor = all_gather(torch.tensor([data], dtype=dtype, device=_device()), group)
    return values.tolist()


def _device() -> torch.device:
    """Where collectives of the live torch.distributed group take their tensors."""
    return objects.comm_device()


def all_gather(tensor: Any, group: Any = None) -> Any:
    """Every rank's ``tensor`` (ignite's types, and any picklable object): a tensor is
    concatenated along dim 0 (a 0-d tensor counts as 1-element); a number, a ``str`` or an
    object gives the list of every rank's value, in rank order. Without a process group: a
    tensor as it is, anything else as ``[tensor]``. ``group``: see this module's docstring; a
    rank outside it gets its ``tensor`` back as it is (a ``str`` as ``[tensor]``)."""
    data = tensor
    if not _active():
        return data if isinstance(data, torch.Tensor) else [data]
    group = groups.resolve(group)
    if groups.not_member(group):
        return [data] if isinstance(data, str) else data
    own = _own(group)
    if isinstance(data, torch.Tensor):
        flat = data.unsqueeze(0) if data.dim() == 0 else data
        if own is not None:
            gathered_tensor: torch.Tensor = own.all_gather(flat.contiguous())
            return gathered_tensor
        parts = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, flat.contiguous(), group=group)
        return torch.cat(parts, dim=0)
    if own is not None:
        return own.all_gather_object(data)
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return _gather_numbers(data, group)
    return objects.all_gather_objects(data, group)


def _check_broadcast(data: Any, src: int, safe_mode: bool) -> None:
    """ignite's checks of ``None``: only on a rank other than ``src`` with ``safe_mode``
    (ValueError)."""
    if data is None:
        if state.get_rank() == src:
            raise ValueError("Source data can not be None")
        if not safe_mode:
            raise ValueError("Argument safe_mode should be True if None is passed for non src "
                             "rank")


def _placeholder(data: Any, src: int, group: Any) -> Any:
    """``data`` on ``src``; elsewhere an empty tensor shaped as ``src``'s tensor, or ``None``
    when ``src`` does not broadcast a tensor (one object broadcast of the shape and dtype)."""
    is_src = state.get_rank() == src
    shape = (tuple(data.shape), data.dtype) if is_src and isinstance(data, torch.Tensor) else None
    own = _own(group)
    if own is not None:
        shape = own.broadcast_object(shape, src)
    else:
        shape = objects.broadcast_object(shape, src, group)
    if is_src:
        return data
    return None if shape is None else torch.empty(shape[0], dtype=shape[1], device=state.device())


def broadcast(tensor: T, src: int = 0, safe_mode: bool = False, *, group: Any = None) -> T:
    """``src``'s ``tensor`` on every rank: a tensor (filled in place and returned), or any
    picklable object (the value as ``src`` has it, pickled: a number keeps its type, a dict or
    an object of the program's own class comes back equal). Ranks other than ``src`` pass a
    placeholder of the same kind (a tensor of the same shape and dtype; for an object, any
    value that is not a tensor), unless ``safe_mode=True``: then they may pass anything
    (``None``), at the cost of one more broadcast. ``None`` on ``src``, or elsewhere without
    ``safe_mode``, is a ValueError (serially too). ``group``: see this module's docstring
    (``src`` is a global rank); a rank outside it gets ``tensor`` back as it is."""
    data: Any = tensor
    if not _active():
        if data is None:
            raise ValueError("Argument tensor should not be None")
        return tensor
    _check_broadcast(data, src, safe_mode)
    group = groups.resolve(group)
    if groups.not_member(group):
        return tensor
    if safe_mode:
        data = _placeholder(data, src, group)
    own = _own(group)
    if own is not None:
        if isinstance(data, torch.Tensor):
            own.broadcast(data, src)
            return cast(T, data)
        value: T = own.broadcast_object(data, src)
        return value
    if isinstance(data, torch.Tensor):
        dist.broadcast(data, src=src, group=group)
        return cast(T, data)
    result: T = objects.broadcast_object(data, src, group)
    return result


def barrier(*, group: Any = None) -> None:
    """Wait until every rank gets here (returns at once without a process group).
    ``group``: see this module's docstring; a rank outside it does not wait."""
    if _active():
        group = groups.resolve(group)
        if groups.not_member(group):
            return
        own = _own(group)
        if own is not None:
            own.barrier()
        else:
            dist.barrier(group=group)
