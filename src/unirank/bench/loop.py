"""Time and check one collective at one size on this rank (torch; imported by workers only).

Known inputs: with ``P(k) = k % 113 + 1`` (exact in every benchmark dtype, int8 included) and
``k`` an element's index in the op's global numbering, each rank fills its send buffer so that the
correct result is ``P`` of known indices:

* all_reduce: element ``k`` is ``P(k)`` on rank ``k % n``, 0 elsewhere; the sum is ``P(k)``;
* broadcast: the root holds ``P(k)``, the others 0;
* all_gather: rank ``r`` sends ``P(r*b + j)``; the output is ``P(k)``;
* reduce_scatter: input element ``k`` is ``P(k)`` on rank ``k % n``; rank ``r`` gets
  ``P(r*b + j)``;
* all_to_all: rank ``r`` sends ``P((r*n + d)*b + j)`` to rank ``d``, and so receives
  ``P((s*n + r)*b + j)`` from rank ``s``.

Adding zeros is exact, so #wrong (the elements that differ from the expected tensor) is 0
unless data was lost, misplaced or corrupted. Timing follows nccl-tests: ``warmup`` calls, a
barrier, ``iters`` back-to-back calls; the mean is the loop's time over ``iters``; every call is
also stamped (``perf_counter`` on CPU, CUDA events on a GPU) for the median. Then the inputs are
written again and one more call is checked.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from unirank.bench.ops import Layout

__all__ = ["Measurement", "barrier", "copy_seconds", "measure", "pattern"]

_MODULUS = 113  # a prime below 127: P(k) fits int8, and blocks of a power-of-two size differ


@dataclass(frozen=True)
class Measurement:
    """This rank's result for one size: mean and median seconds per call, wrong elements."""

    mean_s: float
    median_s: float
    wrong: int


def pattern(index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``P(index) = index % 113 + 1`` in ``dtype``."""
    return (index % _MODULUS + 1).to(dtype)


def _inputs(op: str, lay: Layout, rank: int, n: int, device: torch.device,
            dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(send buffer, expected result) with the known values of the module docstring."""
    b = lay.count
    total = max(lay.send, lay.recv)
    index_type = torch.int32 if (n + 1) * total < 2**31 else torch.int64  # half the memory
    idx = torch.arange(total, dtype=index_type, device=device)
    if op in ("all_reduce", "reduce_scatter"):
        send = torch.where(idx % n == rank, pattern(idx, dtype), torch.zeros((), dtype=dtype,
                                                                             device=device))
        expected = pattern(idx[:lay.recv] + (rank * b if op == "reduce_scatter" else 0), dtype)
    elif op == "broadcast":
        expected = pattern(idx, dtype)
        send = expected.clone() if rank == 0 else torch.zeros_like(expected)
    elif op == "all_gather":
        send = pattern(idx[:b] + rank * b, dtype)
        expected = pattern(idx, dtype)
    else:  # all_to_all
        send = pattern(idx + rank * n * b, dtype)
        peer = torch.arange(n, dtype=index_type, device=device)[:, None]
        expected = pattern(((peer * n + rank) * b + idx[:b][None, :]).flatten(), dtype)
    return send[:lay.send].contiguous(), expected


def _call(op: str) -> Callable[[torch.Tensor, torch.Tensor], object]:
    """``fn(send, recv)`` running ``op`` (``send is recv`` for the in-place ones)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    calls: dict[str, Callable[[torch.Tensor, torch.Tensor], object]] = {
        "all_reduce": lambda send, recv: dist.all_reduce(recv),
        "broadcast": lambda send, recv: dist.broadcast(recv, src=0),
        "all_gather": lambda send, recv: gather(recv, send),
        "reduce_scatter": lambda send, recv: scatter(recv, send),
        "all_to_all": lambda send, recv: dist.all_to_all_single(recv, send),
    }
    return calls[op]


def barrier(device: torch.device) -> None:
    """Every rank reaches this point (a one-element all_reduce on the group's device)."""
    dist.all_reduce(torch.zeros(1, device=device))


def _stamped(fn: Callable[[], object], iters: int, device: torch.device) -> list[float]:
    """Seconds at the start and after each of ``iters`` calls of ``fn`` (relative times)."""
    if device.type == "cuda":
        events = [torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                  for _ in range(iters + 1)]
        events[0].record()
        for event in events[1:]:
            fn()
            event.record()
        torch.cuda.synchronize(device)
        return [events[0].elapsed_time(e) / 1e3 for e in events]
    stamps = [time.perf_counter()]
    for _ in range(iters):
        fn()
        stamps.append(time.perf_counter())
    return [s - stamps[0] for s in stamps]


def _mean_median(stamps: list[float]) -> tuple[float, float]:
    calls = [b - a for a, b in zip(stamps, stamps[1:])]
    return stamps[-1] / len(calls), statistics.median(calls)


def measure(op: str, lay: Layout, dtype: torch.dtype, device: torch.device, iters: int,
            warmup: int) -> Measurement:
    """Time ``op`` on buffers of ``lay`` and check one more call (this rank's view)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    send, expected = _inputs(op, lay, rank, n, device, dtype)
    in_place = op in ("all_reduce", "broadcast")
    recv = send if in_place else torch.zeros(lay.recv, dtype=dtype, device=device)
    call = _call(op)
    for _ in range(warmup):
        call(send, recv)
    barrier(device)
    mean, median = _mean_median(_stamped(lambda: call(send, recv), iters, device))
    send, expected = _inputs(op, lay, rank, n, device, dtype)
    recv = send if in_place else torch.zeros(lay.recv, dtype=dtype, device=device)
    barrier(device)
    call(send, recv)
    wrong = int((recv != expected).sum().item())
    return Measurement(mean_s=mean, median_s=median, wrong=wrong)


def copy_seconds(nbytes: int, device: torch.device, iters: int, warmup: int) -> float:
    """Mean seconds for this one process to copy ``nbytes`` bytes on ``device``
    (``dst.copy_(src)``), the physical reference beside the collective."""
    src = torch.ones(max(nbytes, 1), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(warmup):
        dst.copy_(src)
    stamps = _stamped(lambda: dst.copy_(src), iters, device)
    return stamps[-1] / iters
