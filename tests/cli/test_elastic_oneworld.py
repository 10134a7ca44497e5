"""One world at every moment (:func:`unirank.supervisor.rdzv.rounds.has_quorum`), with real
processes: two ``unirank run`` of one elastic 1:2 job on this host (the same command twice, as
torchrun's agents), one node's whole process tree frozen (SIGSTOP: a hung machine, its
connections open and silent) until the job has moved on, then resumed. Before the quorum, a
resumed node that did not serve the rendezvous served one of its own and trained a second
copy of the job beside the first.

Each world's rank 0 resumes from a checkpoint file (the step it reached) and logs every step
with its world's identity (its store's address and its node's restart) and size
(tests/integration/_oneworld.py): the test asserts that no two worlds' steps interleave in
time and that the steps strictly increase.

Environment variables read: the caller's environment, from which launcher variables are removed
(see ``tests/_procs.py``).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from _oneworld import STEPS, Job, check_one_world, listening, send

from _procs import Runner, process_tree

pytestmark = pytest.mark.integration


def test_the_check_sees_two_worlds_side_by_side() -> None:
    """The check itself: two copies training at once (the split this file guards against)
    interleave in time and repeat steps; one world after another passes."""
    split = "1 a/0 1 5\n2 b/0 1 5\n3 a/0 1 6\n4 b/0 1 6\n"
    with pytest.raises(AssertionError):
        check_one_world(split)
    with pytest.raises(AssertionError):  # interleaved, even with increasing steps
        check_one_world("1 a/0 2 5\n2 b/0 1 6\n3 a/0 2 7\n")
    assert check_one_world("1 a/0 2 5\n2 a/0 2 6\n3 b/1 1 7\n4 a/1 2 8\n") == [
        ("a/0", 2, [5, 6]), ("b/1", 1, [7]), ("a/1", 2, [8])]


@pytest.mark.parametrize("frozen", ["other", "serving"])
def test_a_frozen_node_resumed_never_trains_a_second_world(runner: Runner, tmp_path: Path,
                                                           frozen: str) -> None:
    """Either node's whole tree frozen until the job moved on, then resumed: one world at
    every moment, the steps strictly increasing, both nodes end 0. The other node frozen: the
    serving node goes on alone (the tie-break: it is the first of the round), and the resumed
    node joins it. The serving node frozen: the other waits for it (a two-node job cannot
    tell a frozen first node from a dead one), and both go on once it resumes."""
    job = Job(runner, tmp_path)
    serving = job.node()
    listening(job.port, serving)
    other = job.node()
    job.step_of_world(2)
    proc = other if frozen == "other" else serving
    tree = process_tree(proc.pid)
    try:
        send(tree, signal.SIGSTOP)
        if frozen == "other":
            job.step_of_world(1)  # the serving node trains alone
        else:
            job.said("unirank run: store moved to node ", index=1)  # the other gave up on it
    finally:
        send(tree, signal.SIGCONT)
    codes = job.end()
    said = job.said()
    assert codes == [0, 0], said
    worlds = check_one_world((tmp_path / "steps.log").read_text())
    assert "unirank run: an elastic job of 2 nodes cannot tell a stalled or cut-off first " \
        "node from a lost one" in said, said
    assert worlds[-1][2][-1] == STEPS - 1, worlds
    if frozen == "other":
        assert [size for _ident, size, _steps in worlds][:2] == [2, 1], worlds
