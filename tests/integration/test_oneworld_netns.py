"""One world at every moment across a partition (:func:`...rdzv.rounds.has_quorum`): three
(and five) ``unirank run`` nodes of one elastic 1:N job, each in a network namespace of its own on
one bridge (tests/integration/_netns.py), node 1 serving the rendezvous. Node 1's link is cut
until nodes 2 and 3 train on at a world of 2, then restored. Before the quorum, node 1 trained
on alone at a world of 1 beside them; now it stops its workers, holds no quorum (one of three),
and joins the job's next round once its link is back: the steps of no two worlds interleave,
the steps strictly increase (tests/integration/_oneworld.py), and every node ends 0. The same
with two nodes, where the tie-break lets node 1 (the first of the round) go on and node 2
waits. Root only (skips elsewhere, fails with ``CI=true``).

Environment variables read: the caller's environment, from which launcher variables are removed
(see ``tests/_procs.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _netns import IFNAME, Net, address, require
from _oneworld import STEPS, Job, check_one_world, listening

from _procs import Runner

pytestmark = pytest.mark.integration


def _env(node: int) -> dict[str, str]:
    """Node ``node``'s name; gloo's pairs on the node's own interface (the host's name resolves
    to nothing inside a namespace, and loopback is each namespace's own)."""
    return {"UNIRANK_NODE_NAME": f"node{node}", "GLOO_SOCKET_IFNAME": IFNAME}


@pytest.fixture(params=[5, 3, 2])
def net(request: pytest.FixtureRequest) -> Iterator[Net]:
    require()
    with Net(request.param) as made:
        yield made


def test_the_serving_node_cut_off_then_restored_leaves_one_world(runner: Runner, tmp_path: Path,
                                                                 net: Net) -> None:
    """Three (five) nodes: the others (a majority) move the rendezvous and train at a world of
    2 (4); node 1 waits. Two nodes (the rule's tie-break): node 1, the first of the round, trains on
    alone at a world of 1 and node 2 waits; either way one world, and all end 0 once healed."""
    count = len(net.nodes)
    job = Job(runner, tmp_path, nnodes=f"1:{count}", endpoint=address(1))
    first = job.node(net.prefix(1), address(1), env=_env(1))
    listening(job.port, first, net.prefix(1), address(1))
    for node in net.nodes[1:]:
        job.node(net.prefix(node), address(node), env=_env(node))
    job.step_of_world(count)
    net.cut(1)
    try:
        job.step_of_world(count - 1)  # the side holding the quorum trains on
    finally:
        net.heal(1)
    codes = job.end()
    said = job.said()
    assert codes == [0] * count, said
    worlds = check_one_world((tmp_path / "steps.log").read_text())
    assert [size for _ident, size, _steps in worlds][:2] == [count, count - 1], worlds
    assert worlds[-1][2][-1] == STEPS - 1, worlds
    if count == 2:  # node 1 went on: node 2 never trained apart, and joined it again
        assert worlds[1][0].startswith(address(1) + ":"), worlds
    assert net.close() == [], said  # nothing left running
