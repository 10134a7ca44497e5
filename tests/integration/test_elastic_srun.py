"""The dynamic rendezvous on the two-node testbed: ``srun -N2 --ntasks-per-node=1`` starts the
same ``unirank run --rdzv-backend c10d --rdzv-endpoint node1:PORT`` on both nodes, without
``--node-rank`` and with Slurm's variables removed (as on machines without a batch system, where
the same command is started on every node by hand or by a cloud's tooling; under srun itself
unirank run takes srun's node ranks). One world of 4: node1 (the endpoint's) runs ranks 0-1.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import SlurmTestbed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _outputs import JOB_ENV, PY, REPO, check_world, parse_hello

from _procs import free_port

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

TIMEOUT = 120.0


def test_the_same_command_on_both_nodes_without_node_rank(slurm_testbed: SlurmTestbed) -> None:
    command = shlex.join([
        PY, "-m", "unirank", "run", "--nnodes", "2", "--nproc-per-node", "2",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"node1:{free_port()}",
        "--rdzv-conf", "join_timeout=60"])
    # this node's name, then no Slurm variable left: unirank run sees no launcher
    shell = ('node="$SLURMD_NODENAME"; unset $(env | sed -n "s/^\\(SLURM[A-Z_]*\\)=.*/\\1/p"); '
             f'UNIRANK_NODE_NAME="$node" exec {command} --local-addr "$node" '
             "examples/helloworld.py --backend gloo")
    result = slurm_testbed.srun(["-N2", "--ntasks-per-node=1", f"--chdir={REPO}", "sh", "-c",
                                 shell], timeout=TIMEOUT, env=JOB_ENV)
    out = result.stdout + result.stderr
    check_world(parse_hello(result.stdout), 4, addr="node1",
                nodes=["node1", "node1", "node2", "node2"], context=out)
