"""A node that refuses to start tells the others only where the plan names them
(:func:`unirank.supervisor.plan.giveup_address`): the master of the nodes it was to join, when
the options, MASTER_ADDR or the launcher name it; never a ``127.0.0.1`` no one gave. The abort
value lands in a real store served here on 127.0.0.1, through the real child process
(:mod:`unirank.supervisor.giveup`); a store that nothing serves is given up on within the
bound, with False."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

from _procs import Runner, free_port
from unirank.distenv import DistEnv
from unirank.joincheck import ABORT_PREFIX, ALL_KEY
from unirank.launchers import detect
from unirank.supervisor.giveup import _main, tell_others
from unirank.supervisor.plan import LaunchRequest, giveup_address

#: a one-per-node Slurm step of two nodes, as detection describes it
SLURM_TWO_NODES = DistEnv(launcher="slurm", rank=1, world_size=2, node_rank=1, num_nodes=2,
                          master_addr="n0", master_port=20504, node_name="n1",
                          hosts=("n0", "n1"), tasks_per_node=(1, 1))
#: ``mpirun -np 2`` on one node: detection's master is that node's own 127.0.0.1
MPI_ONE_NODE = DistEnv(launcher="openmpi", rank=1, local_rank=1, world_size=2,
                       local_world_size=2, master_addr="127.0.0.1", master_port=29500)


def local(environ: dict[str, str]) -> DistEnv:
    """No launcher, with ``environ``'s MASTER_ADDR/MASTER_PORT, as detection describes it."""
    return detect(environ, argv=[], hostname="box")


@pytest.mark.parametrize(("request_", "outer", "expected"), [
    # the case: two nodes, no master given: no one to tell (not 127.0.0.1:29500)
    (LaunchRequest(nnodes=2, node_rank=0), local({}), None),
    (LaunchRequest(nnodes=2, node_rank=0), local({"MASTER_PORT": "1234"}), None),
    (LaunchRequest(nnodes=2, master_addr="h"), local({}), ("h", 29500)),
    (LaunchRequest(nnodes=2, master_addr="h", master_port=7), local({}), ("h", 7)),
    (LaunchRequest(nnodes=2), local({"MASTER_ADDR": "m", "MASTER_PORT": "8"}), ("m", 8)),
    # one node, or on its own: no one else
    (LaunchRequest(), local({"MASTER_ADDR": "m"}), None),
    (LaunchRequest(nnodes=1, master_addr="h"), local({}), None),
    (LaunchRequest(standalone=True, nnodes=2, master_addr="h"), local({}), None),
    # the launcher's nodes: its master, or the options
    (LaunchRequest(node_rank=0), SLURM_TWO_NODES, ("n0", 20504)),
    (LaunchRequest(master_addr="x", master_port=5), SLURM_TWO_NODES, ("x", 5)),
    # a launcher's world of one node: its 127.0.0.1 is its own, not the others'
    (LaunchRequest(nnodes=2), MPI_ONE_NODE, None),
])
def test_giveup_address(request_: LaunchRequest, outer: DistEnv, expected: Any) -> None:
    assert giveup_address(request_, outer) == expected


def test_a_refusal_without_a_master_contacts_no_one(runner: Runner) -> None:
    """``unirank run --nnodes 2 --node-rank 0`` with no master refuses with its one line and
    connects to nothing: a store listening on the port it would have told (MASTER_PORT, on
    127.0.0.1) sees no connection."""
    runner.script("never.py", "raise SystemExit('must not run')\n")
    with socket.socket() as store:
        store.bind(("127.0.0.1", 0))
        store.listen()
        port = store.getsockname()[1]
        result = runner.run(["--nnodes", "2", "--node-rank", "0", "never.py"],
                            env={"MASTER_PORT": str(port), "UNIRANK_INIT_TIMEOUT": "300"},
                            timeout=100)
        store.setblocking(False)
        with pytest.raises(BlockingIOError):
            store.accept()  # a connection made while it ran would wait here
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "unirank run: error: --master-addr=<unset>: is needed with 2 nodes: they must agree on "
        "the host of rank 0 HINT: pass --master-addr <node 0's host name or address> on every "
        "node (or export MASTER_ADDR)"]




def test_the_reason_reaches_the_store_as_the_join_checks_abort_value(
        served: tuple[Any, int]) -> None:
    store, port = served
    assert tell_others("127.0.0.1", port, "node2 gave up:\n  --nproc-per-node  disagrees",
                       dict(os.environ), timeout=30)
    assert bytes(store.get(ALL_KEY)).decode() == \
        f"{ABORT_PREFIX}node2 gave up: --nproc-per-node disagrees"


def test_a_store_nobody_serves_is_given_up_on_with_false() -> None:
    assert tell_others("127.0.0.1", free_port(), "node2 gave up", dict(os.environ),
                       timeout=0.5) is False


@pytest.mark.parametrize("argv", [["127.0.0.1", "not-a-port", "1", "why"],
                                  ["no.such.host.invalid", "29500", "1", "why"]])
def test_the_child_exits_1_when_it_cannot_set_the_value(argv: list[str]) -> None:
    assert _main(argv) == 1
