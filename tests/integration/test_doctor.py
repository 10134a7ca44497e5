"""``unirank doctor`` under the real srun and sbatch of the two-node testbed: healthy on two
nodes, and each layout failure provoked on purpose (a batch script without srun, two tasks on one
fake GPU with nccl, every task a world of one), with its status and exact hint."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import SlurmTestbed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _outputs import JOB_ENV, REPO, console_script

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

TIMEOUT = 90.0


def _doctor(*args: str) -> list[str]:
    return [f"--chdir={REPO}", console_script("unirank"), "doctor", *args]


def _row(output: str, name: str) -> tuple[str, str]:
    """(the first row named ``name``, the HINT line under it)."""
    lines = output.splitlines()
    index = next(i for i, line in enumerate(lines) if line.startswith(name + " "))
    below = lines[index + 1].strip() if index + 1 < len(lines) else ""
    return lines[index], below


def test_two_nodes_are_healthy(slurm_testbed: SlurmTestbed) -> None:
    """``srun -N2 -n2 unirank doctor --json``: rank 0 alone prints one JSON object, all OK."""
    proc = slurm_testbed.srun(["-N2", "-n2", *_doctor("--json")], timeout=TIMEOUT,
                              env=JOB_ENV, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    rows = {row["name"]: row for row in data["checks"]}
    assert data["ok"] is True, proc.stdout
    assert rows["group"]["status"] == "OK"
    assert "2 ranks on 2 nodes (node1, node2)" in rows["group"]["detail"]
    assert rows["world size"]["status"] == "OK"


def test_every_task_a_world_of_one_fails(slurm_testbed: SlurmTestbed) -> None:
    """Detection forced wrong on every task: each believes it is alone, and says so."""
    env = {**JOB_ENV, "UNIRANK_LAUNCHER": "local"}
    proc = slurm_testbed.srun(["-N2", "-n2", *_doctor()], timeout=TIMEOUT, env=env,
                              check=False)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert proc.stdout.count("doctor FAILED") == 2, proc.stdout
    row, hint = _row(proc.stdout, "world size")
    assert "FAIL    SLURM_STEP_NUM_TASKS=2 tasks were started, but this rank detected a world " \
        "of 1 (local)" in row, proc.stdout
    assert hint == ("HINT: export UNIRANK_LAUNCHER=<the launcher that started the tasks> "
                    "(e.g. slurm), or unset stale RANK/WORLD_SIZE variables")


def test_two_tasks_on_one_gpu_with_nccl_fail(slurm_testbed: SlurmTestbed) -> None:
    """``--gres=gpu:1`` shared by two tasks (fake GPUs): both would use GPU 0 of node1."""
    proc = slurm_testbed.srun(["-N1", "-n2", "--gres=gpu:1", *_doctor("--backend", "nccl")],
                              timeout=TIMEOUT, env=JOB_ENV, check=False)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    row, hint = _row(proc.stdout, "gpu binding")
    assert row.endswith("FAIL    ranks share a GPU: GPU 0 on node1: rank 0 (node1), rank 1 "
                        "(node1)"), proc.stdout
    assert hint == ("HINT: give each task its own GPU: srun --gpus-per-task=1 (or "
                    "--ntasks-per-node=<GPUs per node>), or --backend gloo")


def test_batch_script_without_srun_fails(slurm_testbed: SlurmTestbed) -> None:
    """``sbatch -N1 -n2`` whose script runs ``unirank doctor`` itself, not through srun."""
    command = " ".join(_doctor()[1:])
    result = slurm_testbed.sbatch_and_wait(f"cd {REPO}\n{command}\n", timeout=TIMEOUT,
                                           args=["-N1", "-n2"], env=JOB_ENV)
    assert result.exit_code == 1, result.output
    row, hint = _row(result.output, "launcher")
    assert "FAIL    a Slurm allocation shell holding 2 tasks, but no task was launched" in row
    assert hint == "HINT: start the tasks with: srun unirank doctor (and srun your script)"
    assert "group check: no group" in result.output
