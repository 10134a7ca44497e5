"""Phases of a program that are slow on purpose: ``with ur.phase("eval"):``.

While some rank of the job is in a phase (:func:`phase`, also what ``ur.save_state`` and
``ur.load_state`` run in), the learned hang timeout ends nothing
(:mod:`unirank.hang.learned`): a rank that evaluates, saves or compiles inside one may keep
the others waiting in a collective as long as it takes. The phase is the process's (any of
its threads may enter one); the rank's watcher publishes the innermost one's name in its
record (``phase``) at each look. A fixed ``--hang-timeout S`` counts phases as any wait.

Imports no torch; reads no environment variable.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["current", "phase"]

#: the phases entered and not left, innermost last: (a token of the entry, its name)
_OPEN: list[tuple[object, str]] = []
_LOCK = threading.Lock()


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark the code inside as slow on purpose, under ``name`` (``"eval"``, ``"checkpoint"``):
    while any rank is inside, a learned hang timeout does not end the job. Usable as a
    decorator too."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a phase's name is a non-empty text, not {name!r}")
    token = object()
    with _LOCK:
        _OPEN.append((token, name.strip()))
    try:
        yield
    finally:
        with _LOCK:
            _OPEN[:] = [entry for entry in _OPEN if entry[0] is not token]


def current() -> str:
    """The innermost phase this process is in, ``""`` outside any."""
    with _LOCK:
        return _OPEN[-1][1] if _OPEN else ""
