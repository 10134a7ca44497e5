"""Open MPI's real ``mpirun`` across the testbed's two nodes, one rank per node.

``salloc -N2`` holds node1 and node2, and ``mpirun --map-by node`` starts its daemons through
srun, one rank per node (OMPI local size 1); each rank is a per-node ``unirank run -n 2``, so
the world is 4. (tests/examples covers mpirun on this one host with MASTER_ADDR/MASTER_PORT
exported, as the SuperCloud batch script does.)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import SlurmTestbed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _outputs import (
    EXAMPLES,
    JOB_ENV,
    check_world,
    console_script,
    only,
    parse_hello,
    task_infos,
    with_info,
)

pytestmark = [pytest.mark.mpi, pytest.mark.integration]

TIMEOUT = 120.0


@pytest.mark.slurm
def test_mpirun_one_rank_per_node_runs_unirank_run(
    slurm_testbed: SlurmTestbed, mpirun: list[str]
) -> None:
    result = slurm_testbed.salloc(
        ["-N2", "--ntasks-per-node=1", *mpirun, "--bind-to", "none", "--map-by", "node",
         "-np", "2", *with_info(console_script("unirank"), "run", "-n", "2",
                                str(EXAMPLES / "helloworld.py"))],
        timeout=TIMEOUT, env=JOB_ENV,
    )
    out = result.stdout + result.stderr
    infos = [r["info"] for r in task_infos(result.stdout)]
    assert [(i["launcher"], i["rank"], i["world_size"], i["local_world_size"], i["node_name"])
            for i in infos] == [("openmpi", 0, 2, 1, "node1"), ("openmpi", 1, 2, 1, "node2")], out
    addr = only((i["master_addr"] for i in infos), "master address")
    port = only((i["master_port"] for i in infos), "master port")
    assert addr == "node1", out  # the batch system's first host
    # README: the port comes from OMPI_MCA_ess_base_jobid by the formula (its digits)
    job = only((i["job_id"] for i in infos), "job id")
    digits = int("".join(re.findall(r"\d+", job)))
    assert port == 20000 + 12 * (digits % 1000), out
    check_world(parse_hello(result.stdout), 4, addr="node1", port=port,
                nodes=["node1", "node1", "node2", "node2"], context=out)
