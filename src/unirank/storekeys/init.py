"""The keys of a group's start and end: ``ur.init``'s prefix per init, each group start's join
keys, the ranks' claims and the exit barrier of ``unirank run``'s workers, Horovod's host
exchange."""

from __future__ import annotations

__all__ = ["EXIT_ALL_KEY", "EXIT_COUNT_KEY", "GROUP_PREFIX", "HOROVOD_HOST_PREFIX",
           "HOROVOD_SLOT_PREFIX", "RANK_CLAIM_PREFIX", "group_prefix", "init_prefix",
           "rank_claim_key"]

#: the store prefix of the n-th group start's join keys: ``unirank/group/<n>/``
GROUP_PREFIX = "unirank/group/"
#: each rank claims its rank once (a rank started twice is refused)
RANK_CLAIM_PREFIX = "unirank/rank/"
#: the exit barrier: how many ranks have ended their program, and the mark that all have
EXIT_COUNT_KEY = "unirank/exit/count"
EXIT_ALL_KEY = "unirank/exit/all"
#: Horovod's start: each rank's host, then rank 0's slot answer for each rank
HOROVOD_HOST_PREFIX = "unirank/horovod/host/"
HOROVOD_SLOT_PREFIX = "unirank/horovod/slot/"


def init_prefix(generation: int) -> str:
    """The prefix of ``ur.init``'s ``generation``-th init (its join under ``/join``, torch's
    group under ``/pg``)."""
    return f"unirank/init/{generation}"


def group_prefix(start: int) -> str:
    """The prefix of the ``start``-th group start's join keys."""
    return f"{GROUP_PREFIX}{start}/"


def rank_claim_key(rank: int) -> str:
    return f"{RANK_CLAIM_PREFIX}{rank}"
