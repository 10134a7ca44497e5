"""GPUs without torch (:mod:`unirank.gpus`): visibility, the local rank -> GPU binding, and the
one "nccl fits" rule that the runtime's backend choice, ``unirank doctor`` and ``unirank sbatch``
all ask.

There is no GPU on this machine, so the GPU side is simulated, and only that: CUDA's facts are
:class:`~unirank.runtime.backends.CudaFacts` values, a node's GPUs are ``CUDA_VISIBLE_DEVICES``
values in plain dicts or entries of a folder the test makes in place of the NVIDIA driver's
``/proc/driver/nvidia/gpus``, and torch's CUDA build is a doctor ``Versions`` with a CUDA version.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from _procs import assert_snippet_runs
from unirank.distenv import DistEnv
from unirank.doctor import checks
from unirank.doctor.facts import Facts, Versions
from unirank.doctor.result import FAIL, OK, Check
from unirank.errors import ConfigError
from unirank.gpus import (
    count_visible_devices,
    device_index,
    gpus_bound_per_task,
    nccl_fits,
    own_gpu,
    physical_gpu,
    planned_device,
    visible_devices,
    visible_gpu_count,
)
from unirank.runtime.backends import CudaFacts, choose_backend
from unirank.sbatch.spec import JobSpec, check_spec

CUDA_BUILD = Versions("3.11.7", "0.1.0", "2.13.0", "12.4")
SRC = Path(__file__).resolve().parents[1] / "src" / "unirank"


# --- the one home --------------------------------------------------------------------------


def test_gpus_imports_no_torch_and_reads_no_process_environment() -> None:
    assert "os.environ" not in (SRC / "gpus.py").read_text()
    assert_snippet_runs("import sys, unirank.gpus; assert 'torch' not in sys.modules, 'torch'")


def test_the_visibility_variable_is_spelled_in_gpus_only() -> None:
    """``CUDA_VISIBLE_DEVICES`` as a string in code outside gpus.py is a second reading of it
    (docstrings name it without quotes)."""
    literal = re.compile(r"""["']CUDA_VISIBLE_DEVICES["']""")
    elsewhere = sorted(str(path.relative_to(SRC)) for path in SRC.rglob("*.py")
                       if path.name != "gpus.py" and literal.search(path.read_text()))
    assert elsewhere == []

# --- visibility ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", []),
        ("0", ["0"]),
        ("0,1", ["0", "1"]),
        ("2, 3", ["2", "3"]),
        ("GPU-8b1c,GPU-99aa", ["GPU-8b1c", "GPU-99aa"]),
        ("-1", []),
        ("-2,0", []),  # any negative entry ends the list
        ("NoDevFiles", []),
        ("nodevfiles", []),
        ("0,-1,2", ["0"]),  # CUDA stops at the first invalid entry
        ("0,,1", ["0"]),  # an empty entry too
    ],
)
def test_visible_devices(value: str | None, expected: list[str] | None) -> None:
    environ = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert visible_devices(environ) == expected


@pytest.mark.parametrize(
    ("environ", "local_rank", "expected"),
    [
        # srun -n2 --gpus-per-task=1: one task sees GPU 0, the other GPU 1; each uses cuda:0
        ({"CUDA_VISIBLE_DEVICES": "0"}, 0, "cuda:0"),
        ({"CUDA_VISIBLE_DEVICES": "1"}, 1, "cuda:0"),
        # srun --ntasks-per-node=2 --gres=gpu:2: both see 0,1; local rank picks
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, 0, "cuda:0"),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, 1, "cuda:1"),
        ({}, 1, "cpu"),
        ({"CUDA_VISIBLE_DEVICES": ""}, 0, "cpu"),
    ],
)
def test_planned_device_from_cuda_visible_devices(
    environ: dict[str, str], local_rank: int, expected: str
) -> None:
    assert planned_device(environ, local_rank) == expected


def test_planned_device_without_cuda_is_cpu() -> None:
    assert planned_device({"CUDA_VISIBLE_DEVICES": "0,1"}, 1, cuda_available=False) == "cpu"


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, False), ("", False), ("0", False), ("1", True), ("2", True), ("a100:1", True),
     ("x", False)],
)
def test_gpus_bound_per_task(value: str | None, expected: bool) -> None:
    environ = {} if value is None else {"SLURM_GPUS_PER_TASK": value}
    assert gpus_bound_per_task(environ) is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [("gpu:per_task:1", True), ("gpu:per_task:2", True), ("gpu:single:1", False),
     ("cpu:per_task:1", False), ("", False), ("gpu:per_task:x", False)],
)
def test_gpus_bound_per_task_from_tres_bind(value: str, expected: bool) -> None:
    """srun --gpus-per-task=1 on Slurm 22.05 sets SLURMD_TRES_BIND, not SLURM_GPUS_PER_TASK."""
    assert gpus_bound_per_task({"SLURMD_TRES_BIND": value}) is expected



@pytest.mark.parametrize(
    ("value", "count"),
    [("0,1,2", 3), (" 2 , 3 ", 2), ("", 0), ("-1", 0), ("0,-1,2", 1), ("GPU-aaaa,GPU-bbbb", 2),
     ("GPU-abc,1", 2), ("3", 1), ("NoDevFiles", 0), ("0,,1", 1)],
)
def test_count_visible_devices(value: str, count: int) -> None:
    assert count_visible_devices(value) == count


def test_visible_gpu_count_reads_the_driver_only_when_the_variable_is_unset(
    tmp_path: Path,
) -> None:
    for bus in ("0000:01:00.0", "0000:02:00.0"):
        (tmp_path / bus).mkdir()
    assert visible_gpu_count({}, str(tmp_path)) == 2
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": "1"}, str(tmp_path)) == 1
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": "-1"}, str(tmp_path)) == 0
    assert visible_gpu_count({}, str(tmp_path / "absent")) == 0


# --- binding -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("local_rank", "visible", "index"),
    [(0, 0, None), (3, 0, None), (0, 1, 0), (5, 1, 0), (3, 4, 3), (5, 4, 1), (2, 8, 2)],
)
def test_device_index(local_rank: int, visible: int, index: int | None) -> None:
    assert device_index(local_rank, visible) == index


@pytest.mark.parametrize(
    ("environ", "local_rank", "visible", "expected"),
    [({"CUDA_VISIBLE_DEVICES": "4,5"}, 1, 2, "5"), ({"CUDA_VISIBLE_DEVICES": "GPU-ab"}, 3, 1,
     "GPU-ab"), ({}, 2, 4, "2"), ({"CUDA_VISIBLE_DEVICES": "0,1"}, 0, 0, None)],
)
def test_physical_gpu_names_the_gpu_as_the_node_does(
    environ: dict[str, str], local_rank: int, visible: int, expected: str | None
) -> None:
    assert physical_gpu(environ, local_rank, visible) == expected


@pytest.mark.parametrize(
    ("environ", "local_rank", "expected"),
    [({"CUDA_VISIBLE_DEVICES": "4,5"}, 1, "5"), ({"CUDA_VISIBLE_DEVICES": "4,5"}, 2, "4"),
     ({}, 3, "3"), ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, 0, None)],
)
def test_own_gpu_shows_a_worker_one_gpu(
    environ: dict[str, str], local_rank: int, expected: str | None
) -> None:
    assert own_gpu(environ, local_rank) == expected


# --- nccl fits: one answer for the runtime, doctor and sbatch -----------------------------


@pytest.mark.parametrize(
    ("gpus", "ranks", "per_task", "fits"),
    [(8, 4, False, True), (4, 4, False, True), (2, 4, False, False), (1, 4, False, False),
     (1, 1, False, True), (1, 4, True, True), (0, 1, False, False), (0, 4, True, False)],
)
def test_nccl_fits(gpus: int, ranks: int, per_task: bool, fits: bool) -> None:
    assert nccl_fits(gpus, ranks, per_task_gpus=per_task) is fits


def _runtime_pick(gpus: int, ranks: int, per_task: bool) -> str:
    """What ``unirank.init()`` picks for ``auto`` on a node where torch sees ``gpus`` GPUs."""
    facts = CudaFacts(available=gpus > 0, device_count=gpus, nccl_available=True)
    return choose_backend("auto", facts, local_world_size=ranks, per_task_gpus=per_task)


def _doctor_row(backend: str, gpus: int, ranks: int, per_task: bool) -> Check:
    """Doctor's ``gpus`` row for one rank of a ``ranks``-task srun step on one node."""
    env = DistEnv("slurm", world_size=ranks, local_world_size=ranks, master_addr="node1")
    facts = Facts(
        env=env, env_error=None, backend=backend, spawn=None, gpus=gpus, cuda_visible=None,
        expected_tasks=None, master=None, serves=False, agent_store=False, port_free=None,
        port_owner=None, ephemeral=None, probe=None, interfaces={}, route_ip=None,
        versions=CUDA_BUILD, node="node1", per_task_gpus=per_task,
    )
    found = [row for row in checks.local_checks(facts) if row.name == "gpus"]
    assert len(found) == 1, found
    return found[0]


def _sbatch_accepts(backend: str, gpus: int, ranks: int) -> bool:
    """Whether ``unirank sbatch --gpus-per-node gpus --ntasks-per-node ranks`` takes the job."""
    try:
        check_spec(JobSpec(program="train.py", nodes=2, tasks_per_node=ranks,
                           gpus_per_node=gpus, backend=backend))
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize(
    ("gpus", "ranks", "pick"),
    [(8, 4, "nccl"),  # doctor said "picks gloo" while the runtime picked nccl
     (2, 4, "gloo"),  # sbatch refused the job while the runtime picked gloo
     (1, 4, "gloo"),  # doctor said nccl for one GPU shared by four ranks
     (4, 4, "nccl"), (0, 4, "gloo")],
)
def test_runtime_doctor_and_sbatch_agree_on_auto(gpus: int, ranks: int, pick: str) -> None:
    """``--backend auto`` with ``ranks`` ranks on a node of ``gpus`` GPUs, bound to no task."""
    assert _runtime_pick(gpus, ranks, per_task=False) == pick
    row = _doctor_row("auto", gpus, ranks, per_task=False)
    assert (row.status, row.detail.endswith(f"(picks {pick})")) == (OK, True), row
    assert _sbatch_accepts("auto", gpus, ranks)


@pytest.mark.parametrize(("gpus", "ranks"), [(8, 4), (4, 4), (2, 4), (1, 4), (0, 4)])
def test_doctor_and_sbatch_pass_explicit_nccl_where_auto_picks_it(gpus: int, ranks: int) -> None:
    """``--backend nccl`` passes doctor and sbatch exactly where the runtime's auto picks nccl
    (elsewhere two ranks would share a GPU, which nccl refuses)."""
    fits = _runtime_pick(gpus, ranks, per_task=False) == "nccl"
    assert _doctor_row("nccl", gpus, ranks, per_task=False).status == (OK if fits else FAIL)
    assert _sbatch_accepts("nccl", gpus, ranks) is fits


def test_gpus_bound_per_task_count_as_one_gpu_each_everywhere() -> None:
    """``srun --gpus-per-task=1``: each of 4 tasks sees one GPU of its own."""
    assert _runtime_pick(1, 4, per_task=True) == "nccl"
    auto = _doctor_row("auto", 1, 4, per_task=True)
    assert auto.detail.endswith("bound per task; backend auto (picks nccl)"), auto
    assert _doctor_row("nccl", 1, 4, per_task=True).status == OK
