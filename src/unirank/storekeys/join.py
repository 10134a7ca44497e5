"""The join check's keys (:mod:`unirank.joincheck`): each rank's announcement, the count, the
everyone-joined mark, rank 0's verdict, the coordinator of a scan."""

from __future__ import annotations

__all__ = ["ABORT_PREFIX", "ALL_KEY", "COORDINATOR_KEY", "COUNT_KEY", "JOIN_PREFIX",
           "RESULT_KEY", "join_key", "seen_key"]

JOIN_PREFIX = "unirank/join/"
#: rank 0's verdict after a timeout: "missing:" and the missing ranks, comma-separated
RESULT_KEY = "unirank/join/result"
#: the value of ``ALL_KEY`` that a node giving up sets: this prefix, then its one-line reason
ABORT_PREFIX = "abort:"
#: the number of ranks that have set their join key (each rank adds 1 once)
COUNT_KEY = "unirank/join/count"
#: set by the rank that brought ``COUNT_KEY`` to the world size: everyone has joined
ALL_KEY = "unirank/join/all"
#: after a timeout without rank 0's verdict, the rank that adds 1 here first scans instead
COORDINATOR_KEY = "unirank/join/coordinator"


def join_key(rank: int) -> str:
    """The key rank ``rank`` sets when it joins."""
    return f"{JOIN_PREFIX}{rank}"


def seen_key(rank: int) -> str:
    """The key a scan sets for a rank it found."""
    return f"{JOIN_PREFIX}seen/{rank}"
