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

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from _oneworld import STEPS, Job, check_one_world, listening, send

from _procs import WORKER_MARK, Runner, process_tree, wait_gone

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
    assert "unirank run: an elastic job of 2 nodes cannot tell a stalled or cut-off node " \
        "serving the rendezvous from a lost one" in said, said
    assert worlds[-1][2][-1] == STEPS - 1, worlds
    if frozen == "other":
        assert [size for _ident, size, _steps in worlds][:2] == [2, 1], worlds


def _helper_of(proc: subprocess.Popen[Any]) -> int:
    """The pid of the rendezvous helper of the ``unirank run`` ``proc``."""
    for pid in process_tree(proc.pid):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            if b"unirank.supervisor.rdzv.agent" in cmdline.read():
                return int(pid)
    raise AssertionError(f"no rendezvous helper under pid {proc.pid}")


def test_a_node_whose_helper_died_is_proven_dead(runner: Runner, tmp_path: Path) -> None:
    """What makes a closed connection a proof: the serving node's rendezvous helper killed
    alone (its server with it), its ``unirank run`` stops its workers and ends, and nothing
    of it is left; the other node, second in the round's order, finds the serving node's
    port refused, so goes on alone at once (a quorum of the nodes not proven dead), one world
    at every moment."""
    job = Job(runner, tmp_path)
    serving = job.node()
    listening(job.port, serving)
    job.node()
    job.step_of_world(2)
    tree = process_tree(serving.pid)
    os.kill(_helper_of(serving), signal.SIGKILL)
    codes = job.end()
    said = job.said()
    assert codes[1] == 0 and codes[0] not in (0, None), said
    assert "the rendezvous helper ended" in said.split("--- node 1:")[0], said
    assert wait_gone(tree, mark=WORKER_MARK) == [], said  # its workers too
    worlds = check_one_world((tmp_path / "steps.log").read_text())
    assert [size for _ident, size, _steps in worlds][:2] == [2, 1], worlds
    assert worlds[-1][2][-1] == STEPS - 1, worlds
