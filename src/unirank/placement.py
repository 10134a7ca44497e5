"""Which node runs a rank: the one rule (pure, no torch, no environment).

Consecutive ranks fill the nodes in node-rank order: ``counts[n]`` ranks on node ``n``
(:func:`node_of`, prefix sums). Where only the ranks per node are known, every node holds that
many but the last, which holds the rest (:func:`filled`; mpirun's default ``--map-by slot``):
6 ranks at 4 per node are 2 nodes, ranks 4 and 5 on the second. The planner
(:mod:`unirank.supervisor.plan`), the launchers' readings (:func:`unirank.launchers._base.
by_slot`) and the runtime's hand-made groups (:mod:`unirank.runtime.layout`) all ask here.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["by_slot", "filled", "node_of"]


def filled(world_size: int, per_node: int) -> tuple[int, ...]:
    """The ranks on each node when ``world_size`` ranks fill nodes of ``per_node`` slots in
    order: ``filled(6, 4) == (4, 2)``; ``()`` for an empty world."""
    if world_size <= 0:
        return ()
    per_node = max(per_node, 1)
    full, rest = divmod(world_size, per_node)
    return (per_node,) * full + ((rest,) if rest else ())


def node_of(rank: int, counts: Sequence[int]) -> int | None:
    """The node rank of the node that runs global ``rank``, where consecutive ranks fill the
    nodes in node-rank order, ``counts[n]`` of them on node ``n``; None for a rank outside that
    world, or when the placement is not known (``counts`` empty)."""
    if rank < 0:
        return None
    first = 0
    for node, count in enumerate(counts):
        first += count
        if rank < first:
            return node
    return None


def by_slot(rank: int, world_size: int, per_node: int) -> tuple[int, int]:
    """``(node rank, number of nodes)`` when ranks fill nodes of ``per_node`` slots in order;
    a rank past the world counts as the last node's."""
    counts = filled(world_size, per_node)
    node = node_of(rank, counts)
    return (len(counts) - 1 if node is None else node), max(len(counts), 1)
