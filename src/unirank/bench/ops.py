"""The five collectives and the dtypes, counted as nccl-tests counts them (pure, no torch).

For a requested size of ``S`` bytes of an ``e``-byte type on ``n`` ranks, with ``c = S // e``
and ``b = (c // n)`` rounded down to a multiple of ``16 // e`` elements (16-byte aligned blocks):

============== ============ ============ ============ ===================== =========== ==========
op             count column send (elts)  recv (elts)  size column (bytes)   busbw/algbw redop/root
============== ============ ============ ============ ===================== =========== ==========
all_reduce     c            c            c            c*e                   2(n-1)/n    sum / -1
all_gather     b            b            b*n          b*n*e (the output)    (n-1)/n     none / -1
reduce_scatter b            b*n          b            b*n*e (the input)     (n-1)/n     sum / -1
broadcast      c            c            c            c*e                   1           none / 0
all_to_all     b            b*n          b*n          b*n*e (per rank)      (n-1)/n     none / -1
============== ============ ============ ============ ===================== =========== ==========

``algbw = size / time`` in GB/s (1 GB = 1e9 bytes); ``busbw = algbw * factor``: the rate a link
would need if the algorithm were optimal, comparable across ops and with the hardware's speed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["DTYPES", "OPS", "OP_NAMES", "DType", "Layout", "Op", "algbw", "busbw", "layout"]


@dataclass(frozen=True)
class DType:
    """A benchmark element type: the option's name, nccl-tests' name for it, its size."""

    name: str  # the --dtype value, also torch's attribute name
    nccl_name: str  # the "type" column, as nccl-tests prints it
    itemsize: int


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("float32", "float", 4),
        DType("float16", "half", 2),
        DType("bfloat16", "bfloat16", 2),
        DType("float64", "double", 8),
        DType("int32", "int32", 4),
        DType("int64", "int64", 8),
        DType("int8", "int8", 1),
        DType("uint8", "uint8", 1),
    )
}


@dataclass(frozen=True)
class Op:
    """A collective: its name, the redop and root columns, and its bus-bandwidth factor."""

    name: str
    redop: str  # "sum" or "none"
    root: int  # -1 unless the op has a root
    factor: Callable[[int], float]  # nranks -> busbw / algbw
    blocked: bool  # buffers are n blocks of b elements (all_gather, reduce_scatter, all_to_all)


def _ring(n: int) -> float:
    return (n - 1) / n


OPS: dict[str, Op] = {
    op.name: op
    for op in (
        Op("all_reduce", "sum", -1, lambda n: 2 * (n - 1) / n, blocked=False),
        Op("all_gather", "none", -1, _ring, blocked=True),
        Op("reduce_scatter", "sum", -1, _ring, blocked=True),
        Op("broadcast", "none", 0, lambda n: 1.0, blocked=False),
        Op("all_to_all", "none", -1, _ring, blocked=True),
    )
}
#: the ops in the order ``--op all`` runs them
OP_NAMES: tuple[str, ...] = tuple(OPS)


@dataclass(frozen=True)
class Layout:
    """One row's buffers: ``count`` (the count column), elements sent and received per rank,
    and ``nbytes`` (the size column: the larger of the two buffers, as nccl-tests prints)."""

    count: int
    send: int
    recv: int
    nbytes: int


def layout(op: Op, size: int, itemsize: int, nranks: int) -> Layout:
    """The buffers nccl-tests uses for ``op`` at a requested ``size`` in bytes."""
    count = size // itemsize
    if not op.blocked:
        return Layout(count=count, send=count, recv=count, nbytes=count * itemsize)
    align = max(16 // itemsize, 1)
    block = (count // nranks) // align * align
    total = block * nranks
    send, recv = {
        "all_gather": (block, total),
        "reduce_scatter": (total, block),
    }.get(op.name, (total, total))
    return Layout(count=block, send=send, recv=recv, nbytes=total * itemsize)


def algbw(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes): ``nbytes / seconds``; 0 for no time."""
    return nbytes / 1e9 / seconds if seconds > 0 else 0.0


def busbw(op: Op, nbytes: int, seconds: float, nranks: int) -> float:
    """Bus bandwidth in GB/s: :func:`algbw` times the op's factor for ``nranks``."""
    return algbw(nbytes, seconds) * op.factor(nranks)
