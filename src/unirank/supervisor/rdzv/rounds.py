"""When a rendezvous round closes, and who is in it (pure; no torch, no sockets).

The store's server (:mod:`.server`) holds the job's small state: the members of the last round
in their order, the nodes waiting for the next one, and when the waiting began. These functions
are its decisions, unit-tested in milliseconds:

* :func:`round_closes`: a round closes at once when MAX nodes wait, or after a change when every
  node of the round before that is still alive has rejoined and no new node waits (nothing can
  arrive: no last call). The last call is waited for only where nodes may still arrive: the
  first round below MAX, and a round a new node waits for. A node of the round before that has
  not rejoined within the close timeout is left out.
* :func:`members_of`: the next round's nodes: those of the round before, in their order, then
  the new ones in the order they came, at most MAX.
* :func:`successor`: which node serves the rendezvous once the node serving it is lost: the
  first node of the last round's list that is not known lost. Every node holds the same list
  (the round's answer carries it), so the survivors agree without talking to each other.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

__all__ = ["Pending", "members_of", "round_closes", "successor"]


@dataclass(frozen=True)
class Pending:
    """A round being formed, as the server sees it at one moment."""

    #: the nodes of the round before (empty: this is the job's first round), alive or not
    before: tuple[str, ...]
    #: the nodes alive now (connected, beating)
    alive: frozenset[str]
    #: the nodes waiting for this round, in the order they came
    waiting: tuple[str, ...]
    #: seconds since the first node of this round came, and since MIN nodes waited
    open_for: float
    min_for: float


def round_closes(p: Pending, *, min_nodes: int, max_nodes: int, last_call: float,
                 close_timeout: float) -> bool:
    """Whether the round ``p`` closes now (see the module docstring)."""
    waiting = [n for n in p.waiting if n in p.alive]
    if len(waiting) >= max_nodes:
        return True
    if len(waiting) < min_nodes:
        return False
    if not p.before:  # the first round: more may still come
        return p.min_for >= last_call
    missing = [n for n in p.before if n in p.alive and n not in waiting]
    if missing:
        return p.open_for >= close_timeout
    if any(n not in p.before for n in waiting):  # a new node: others may come with it
        return p.min_for >= last_call
    return True


def members_of(before: Sequence[str], waiting: Sequence[str], alive: frozenset[str],
               max_nodes: int) -> tuple[str, ...]:
    """The next round's nodes: the round before's that wait, in their order, then the new ones
    in the order they came, at most ``max_nodes``."""
    kept = [n for n in before if n in waiting and n in alive]
    new = [n for n in waiting if n not in before and n in alive]
    return tuple((kept + new)[:max_nodes])


def successor(members: Sequence[str], failed: Collection[str]) -> str | None:
    """The node that serves the rendezvous next: the first of the last round's ``members`` (in
    the round's order) not in ``failed`` (the node that served it, and any found unreachable
    since); None when none is left."""
    return next((m for m in members if m not in failed), None)
