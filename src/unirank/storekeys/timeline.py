"""The end-of-run records' keys (:mod:`unirank.supervisor.worker.timeline`)."""

from __future__ import annotations

__all__ = ["KEY_PREFIX", "record_key"]

KEY_PREFIX = "unirank/timeline/"


def record_key(rank: int) -> str:
    """The key of rank ``rank``'s end-of-run record."""
    return f"{KEY_PREFIX}{rank}"
