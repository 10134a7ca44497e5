"""One rank-to-node rule (:mod:`unirank.placement`) and one node-name rule for hand-made groups
(:func:`unirank.runtime.layout.own_node_name`). Issue 33: 6 ranks at 4 per node gave three
answers (prefix sums in the planner, ceil in the launchers, floor in the runtime: one node of
4 ranks holding rank 5), and a hand-made group on nodes that share a host name was one node."""

from __future__ import annotations

import pytest

from unirank.launchers._base import by_slot as launchers_by_slot
from unirank.placement import by_slot, filled, node_of
from unirank.runtime.layout import own_node_name, place
from unirank.supervisor.plan import node_index_of


def test_six_ranks_at_four_per_node_are_two_nodes_everywhere() -> None:
    assert filled(6, 4) == (4, 2)
    assert [node_index_of(r, filled(6, 4)) for r in range(6)] == [0, 0, 0, 0, 1, 1]
    assert launchers_by_slot(5, 6, 4) == (1, 2)
    layout = place(5, 6, 1, 4)
    assert (layout.node_rank, layout.num_nodes) == (1, 2)  # was (1, 1): rank 5 on node 1 of 1


@pytest.mark.parametrize("world", range(1, 13))
@pytest.mark.parametrize("per_node", range(1, 6))
def test_the_planner_the_launchers_and_the_runtime_agree(world: int, per_node: int) -> None:
    counts = filled(world, per_node)
    assert sum(counts) == world and all(0 < c <= per_node for c in counts)
    for rank in range(world):
        node = node_of(rank, counts)
        assert node is not None
        assert by_slot(rank, world, per_node) == (node, len(counts))
        assert launchers_by_slot(rank, world, per_node) == (node, len(counts))
        got = place(rank, world, rank - sum(counts[:node]), per_node)
        assert (got.node_rank, got.num_nodes) == (node, len(counts))
    assert node_of(world, counts) is None and node_of(-1, counts) is None


def test_a_hand_made_group_names_its_node_by_the_one_rule() -> None:
    """Nodes that share a host name (``login``) are told apart by Slurm's name for them, or by
    the name ``unirank run`` gave its workers; the host name is the last resort."""
    assert own_node_name({"SLURMD_NODENAME": "node7"}, "login") == "node7"
    assert own_node_name({"UNIRANK_NODE_NAME": "nodeB"}, "login") == "nodeB"
    assert own_node_name({}, "login") == "login"
