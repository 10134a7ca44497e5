"""The hang exchange through the job's store: each rank's progress record under
:func:`progress_key`, the stack requests (a counter, :data:`ASK_KEY`) and their answers, and
the keys of a failure's report (:data:`FAILED_KEY`, :data:`REPORTED_KEY`); the ending's keys
are in :mod:`unirank.hang.ending`.

Reads no environment variable.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Collection
from datetime import timedelta
from typing import Any, Protocol

__all__ = ["ASK_KEY", "FAILED_KEY", "PROGRESS_PREFIX", "REPORTED_KEY", "STACKS_PREFIX",
           "Answers", "progress_key", "read_live", "read_records", "request_stacks",
           "stacks_key"]

from unirank.storekeys.hang import (  # the exchange's keys: one home (unirank.storekeys)
    ASK_KEY,
    FAILED_KEY,
    PROGRESS_PREFIX,
    REPORTED_KEY,
    STACKS_PREFIX,
    live_key,
    progress_key,
    stacks_key,
)


class Answers(Protocol):
    """What answers a stack request for its own process (a watcher)."""

    def answer(self, store: Any, number: int) -> None: ...


def read_records(store: Any, world_size: int) -> dict[int, dict[str, Any] | None]:
    """Every rank's last progress record (None: it set none yet): one ``multi_get`` when all
    are there."""
    return _read(store, [progress_key(r) for r in range(world_size)])


def read_live(store: Any, world_size: int) -> dict[int, dict[str, Any] | None]:
    """Every rank's last live record (:mod:`unirank.hang.live`; None: none yet), as
    :func:`read_records` reads."""
    return _read(store, [live_key(r) for r in range(world_size)])


def _read(store: Any, keys: list[str]) -> dict[int, dict[str, Any] | None]:
    if store.check(keys):
        return {r: json.loads(bytes(v)) for r, v in enumerate(store.multi_get(keys))}
    return {r: (json.loads(bytes(store.get(k))) if store.check([k]) else None)
            for r, k in enumerate(keys)}


def request_stacks(store: Any, world_size: int, timeout: float, *, own: Answers | None = None,
                   skip: Collection[int] = ()
                   ) -> tuple[dict[int, list[dict[str, Any]]], list[int], dict[int, str]]:
    """Ask every rank's watcher for its stacks (``own``: answer for this process at once) and
    wait for them at most ``timeout`` seconds (not for the ranks in ``skip``, known to be
    stopped): the stacks by rank, the ranks that did not answer, and the nodes of those that
    did."""
    number = int(store.add(ASK_KEY, 1))
    if own is not None:
        own.answer(store, number)
    keys = {r: stacks_key(number, r) for r in range(world_size)}
    awaited = [key for rank, key in keys.items() if rank not in skip]
    with contextlib.suppress(Exception):
        if awaited:
            store.wait(awaited, timedelta(seconds=timeout))
    stacks: dict[int, list[dict[str, Any]]] = {}
    nodes: dict[int, str] = {}
    for rank, key in keys.items():
        if store.check([key]):
            answer = json.loads(bytes(store.get(key)))
            stacks[rank] = answer["threads"]
            nodes[rank] = answer.get("node", "")
    return stacks, [r for r in keys if r not in stacks], nodes
