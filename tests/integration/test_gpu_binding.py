"""GPU binding by Slurm on the testbed's fake GPUs, and the device and backend unirank picks.

There is no CUDA behind ``/dev/fakegpu*``, so CUDA's answers are *simulated* in each real srun
task (``scripts/gpu_choice.py``: "CUDA available, as many devices as CUDA_VISIBLE_DEVICES lists,
NCCL built in"); the pure choice functions of ``unirank.runtime.backends`` then run on the task's
real environment and detected layout. One srun per binding style; its records feed several tests.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import SlurmTestbed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _outputs import JOB_ENV, PY, REPO, SCRIPTS, tagged_json

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

TIMEOUT = 120.0
Records = tuple[str, list[dict[str, Any]]]


def _choices(testbed: SlurmTestbed, options: list[str]) -> Records:
    result = testbed.srun([*options, f"--chdir={REPO}", PY, str(SCRIPTS / "gpu_choice.py")],
                          timeout=TIMEOUT, env=JOB_ENV)
    records = sorted(tagged_json(result.stdout, "GPU_CHOICE"), key=lambda r: int(r["rank"]))
    return result.stdout + result.stderr, records


@pytest.fixture(scope="module")
def gpus_per_task(slurm_testbed: SlurmTestbed) -> Records:
    """``srun -N1 -n2 --gpus-per-task=1``: each task gets its own GPU."""
    return _choices(slurm_testbed, ["-N1", "-n2", "--gpus-per-task=1"])


@pytest.fixture(scope="module")
def gres_two(slurm_testbed: SlurmTestbed) -> Records:
    """``srun -N1 --ntasks-per-node=2 --gres=gpu:2``: both tasks see both GPUs."""
    return _choices(slurm_testbed, ["-N1", "--ntasks-per-node=2", "--gres=gpu:2"])


def test_gpus_per_task_each_task_sees_its_own_gpu_as_cuda_0(gpus_per_task: Records) -> None:
    out, recs = gpus_per_task
    assert [r["rank"] for r in recs] == [0, 1], out
    assert len({r["node"] for r in recs}) == 1, out
    assert sorted(r["cuda_visible_devices"] for r in recs) == ["0", "1"], out
    assert [r["local_world_size"] for r in recs] == [2, 2], out
    assert [r["device"] for r in recs] == ["cuda:0", "cuda:0"], out
    assert [r["planned_device"] for r in recs] == ["cuda:0", "cuda:0"], out


def test_gpus_per_task_auto_backend_is_nccl(gpus_per_task: Records) -> None:
    """One GPU bound to each task: NCCL is usable, so ``auto`` must pick it."""
    out, recs = gpus_per_task
    assert [r["per_task_gpus"] for r in recs] == [True, True], out
    assert [r["backend"] for r in recs] == ["nccl", "nccl"], out


def test_gres_two_gpus_each_task_takes_its_local_rank(gres_two: Records) -> None:
    out, recs = gres_two
    assert [r["rank"] for r in recs] == [0, 1], out
    assert [r["cuda_visible_devices"] for r in recs] == ["0,1", "0,1"], out
    assert [r["local_rank"] for r in recs] == [0, 1], out
    assert [r["device"] for r in recs] == ["cuda:0", "cuda:1"], out
    assert [r["planned_device"] for r in recs] == ["cuda:0", "cuda:1"], out
    assert [r["backend"] for r in recs] == ["nccl", "nccl"], out
