"""The two-node Slurm testbed and the mpirun fixture behave as the other tests assume."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import SlurmTestbed

# One JSON line per task with the variables the tests look at.
_SHOW = (
    "import json, os; os.write(1, (json.dumps({k: os.environ.get(k) for k in ("
    "'SLURM_PROCID', 'SLURM_LOCALID', 'SLURM_NODEID', 'SLURM_NTASKS', 'SLURMD_NODENAME', "
    "'SLURM_STEP_ID', 'SLURM_JOB_NODELIST', 'CUDA_VISIBLE_DEVICES', 'OMPI_COMM_WORLD_RANK', "
    "'OMPI_COMM_WORLD_SIZE')}) + '\\n').encode())"  # one write: ranks' lines never interleave
)
SHOW = [sys.executable, "-c", _SHOW]


def _records(stdout: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


@pytest.mark.slurm
def test_both_nodes_up(slurm_testbed: SlurmTestbed) -> None:
    states = slurm_testbed.node_states()
    assert set(states) == {"node1", "node2"}
    for node, state in states.items():
        assert state in {"idle", "mix", "alloc"}, f"{node} is {state}"


@pytest.mark.slurm
def test_srun_two_nodes_four_tasks(slurm_testbed: SlurmTestbed) -> None:
    result = slurm_testbed.srun(["-N2", "--ntasks-per-node=2", *SHOW], timeout=60)
    recs = sorted(_records(result.stdout), key=lambda r: int(r["SLURM_PROCID"]))
    assert [r["SLURM_PROCID"] for r in recs] == ["0", "1", "2", "3"]
    assert [r["SLURMD_NODENAME"] for r in recs] == ["node1", "node1", "node2", "node2"]
    assert [r["SLURM_LOCALID"] for r in recs] == ["0", "1", "0", "1"]
    assert [r["SLURM_NODEID"] for r in recs] == ["0", "0", "1", "1"]
    assert {r["SLURM_NTASKS"] for r in recs} == {"4"}
    assert {r["SLURM_JOB_NODELIST"] for r in recs} == {"node[1-2]"}
    assert {r["SLURM_STEP_ID"] for r in recs} == {"0"}


@pytest.mark.slurm
def test_fake_gpus_bound_one_per_task(slurm_testbed: SlurmTestbed) -> None:
    result = slurm_testbed.srun(["-N1", "-n2", "--gpus-per-task=1", *SHOW], timeout=60)
    recs = _records(result.stdout)
    assert len(recs) == 2
    assert len({r["SLURMD_NODENAME"] for r in recs}) == 1
    assert sorted(r["CUDA_VISIBLE_DEVICES"] for r in recs) == ["0", "1"]


@pytest.mark.slurm
def test_node_names_resolve_to_distinct_addresses(slurm_testbed: SlurmTestbed) -> None:
    addrs = {node: socket.gethostbyname(node) for node in slurm_testbed.nodes}
    assert addrs == {"node1": "127.0.1.1", "node2": "127.0.1.2"}
    for node, addr in addrs.items():
        shown = subprocess.run(
            ["scontrol", "show", "node", node], capture_output=True, text=True, timeout=30
        ).stdout
        assert f"NodeAddr={addr} " in shown


@pytest.mark.slurm
def test_sbatch_batch_shell_and_step(slurm_testbed: SlurmTestbed) -> None:
    script = (
        "#!/bin/bash\n#SBATCH -N2 --ntasks-per-node=2\n"
        'echo "batch step=${SLURM_STEP_ID-none} procid=$SLURM_PROCID ntasks=$SLURM_NTASKS"\n'
        f'srun {" ".join(SHOW[:2])} "{_SHOW}"\n'
    )
    result = slurm_testbed.sbatch_and_wait(script, timeout=90)
    assert (result.state, result.exit_code) == ("COMPLETED", 0), result.output
    assert "batch step=none procid=0 ntasks=4" in result.output
    recs = _records(result.output)
    assert sorted(r["SLURM_PROCID"] for r in recs) == ["0", "1", "2", "3"]
    assert {r["SLURM_STEP_ID"] for r in recs} == {"0"}


@pytest.mark.slurm
def test_sbatch_reports_failure(slurm_testbed: SlurmTestbed) -> None:
    result = slurm_testbed.sbatch_and_wait("echo before failing\nexit 3\n", timeout=60)
    assert result.state == "FAILED"
    assert result.exit_code == 3
    assert "before failing" in result.output


@pytest.mark.slurm
def test_srun_timeout_cancels_the_job(slurm_testbed: SlurmTestbed) -> None:
    with pytest.raises(slurm_testbed.Timeout):
        slurm_testbed.srun(["-N1", "-n1", "sleep", "300"], timeout=3)
    assert slurm_testbed.queued_test_jobs() == []


@pytest.mark.slurm
def test_sbatch_timeout_cancels_the_job(slurm_testbed: SlurmTestbed) -> None:
    with pytest.raises(slurm_testbed.Timeout):
        slurm_testbed.sbatch_and_wait("sleep 300\n", timeout=3)
    assert slurm_testbed.queued_test_jobs() == []


@pytest.mark.mpi
def test_mpirun_gives_open_mpi_ranks(mpirun: list[str]) -> None:
    result = subprocess.run(
        [*mpirun, "-np", "2", *SHOW], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    recs = _records(result.stdout)
    assert sorted(r["OMPI_COMM_WORLD_RANK"] for r in recs) == ["0", "1"]
    assert {r["OMPI_COMM_WORLD_SIZE"] for r in recs} == {"2"}
