"""Small helpers for code that runs on every rank: run once, run first, print once, log by rank."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Optional, TypeVar

from unirank.runtime import state
from unirank.runtime.collectives import barrier

__all__ = [
    "RankFilter",
    "get_logger",
    "ignite_logger",
    "one_rank_first",
    "one_rank_only",
    "print0",
    "print_in_rank_order",
]

R = TypeVar("R")

LOG_FORMAT = "%(asctime)s [rank %(rank)d/%(world_size)d] %(levelname)s %(name)s: %(message)s"
#: the format of ignite's ``setup_logger``
IGNITE_FORMAT = "%(asctime)s %(name)s %(levelname)s: %(message)s"


def one_rank_only(
    rank: int = 0, with_barrier: bool = False
) -> Callable[[Callable[..., R]], Callable[..., Optional[R]]]:
    """Decorator: the function runs on global rank ``rank`` only; the others get ``None``.

    With ``with_barrier=True`` every rank then waits until that rank has finished.
    """

    def decorate(fn: Callable[..., R]) -> Callable[..., Optional[R]]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Optional[R]:
            result: Optional[R] = None
            try:
                if state.get_rank() == rank:
                    result = fn(*args, **kwargs)
            finally:
                if with_barrier:
                    barrier()
            return result

        return wrapper

    return decorate


@contextmanager
def one_rank_first(rank: int = 0, local: bool = False) -> Iterator[None]:
    """Context manager: rank ``rank`` runs the block first, then all the others (together).

    With ``local=True`` it is the local rank ``rank`` of every node that goes first (e.g. to
    download a data set once per node). Every rank must enter the block. A ``rank`` outside the
    world (or the node) is a ValueError, raised on every rank before anyone waits.
    """
    me = state.get_local_rank() if local else state.get_rank()
    size = state.get_local_world_size() if local else state.get_world_size()
    if not 0 <= rank < size:
        raise ValueError(f"rank should be between 0 and {size - 1}, but given {rank}")
    if me != rank:
        barrier()
    try:
        yield
    finally:
        if me == rank:
            barrier()


def print0(*args: Any, **kwargs: Any) -> None:
    """``print`` on global rank 0 only (same arguments as ``print``)."""
    if state.get_rank() == 0:
        print(*args, **kwargs)


class RankFilter(logging.Filter):
    """Adds ``rank`` and ``world_size`` to each record, read when the record is made."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = state.get_rank()
        record.world_size = state.get_world_size()
        return True


def get_logger(
    name: str = "unirank", level: int = logging.INFO, *, fmt: str = LOG_FORMAT
) -> logging.Logger:
    """A logger whose lines start with the rank, e.g. ``[rank 1/4] INFO name: message``.

    It writes to stderr; calling again with the same name returns the same logger without adding
    a second handler.
    """
    logger = logging.getLogger(name)
    logger.setLevel(level)
    if not any(isinstance(f, RankFilter) for f in logger.filters):
        logger.addFilter(RankFilter())
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(fmt))
        logger.addHandler(handler)
        logger.propagate = False
    return logger


def ignite_logger(name: str) -> logging.Logger:
    """The logger ``name`` as ignite's ``setup_logger`` makes it: on rank 0, level INFO (unless
    one was set), one stderr handler in ignite's format (:data:`IGNITE_FORMAT`), added when the
    logger has none, no propagation to the root logger; on the other ranks, silent (its handlers
    replaced by a ``NullHandler``)."""
    logger = logging.getLogger(name)
    if state.get_rank() > 0:
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.addHandler(logging.NullHandler())
        return logger
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(IGNITE_FORMAT))
        logger.addHandler(handler)
    logger.propagate = False
    return logger


def print_in_rank_order(*args: Any, **kwargs: Any) -> None:
    """Every rank prints in turn, rank 0 first, with a barrier after each turn (flushed).

    Every rank must call it. Lines come out in rank order wherever the ranks share one output
    (local workers, torchrun); a launcher that relays output over the network may reorder them.
    """
    rank, world = state.get_rank(), state.get_world_size()
    kwargs.setdefault("flush", True)
    for turn in range(world):
        if turn == rank:
            print(*args, **kwargs)
        barrier()
