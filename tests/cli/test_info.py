"""`unirank info`: the numbers it prints under python, torchrun and mpirun, and no torch import."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _procs import launcher_free_environ

UNIRANK = [sys.executable, "-m", "unirank"]


def test_info_serial_json() -> None:
    out = subprocess.run([*UNIRANK, "info", "--json"], env=launcher_free_environ(),
                         capture_output=True, text=True, timeout=60, check=True).stdout
    data = json.loads(out)
    assert (data["launcher"], data["rank"], data["world_size"]) == ("local", 0, 1)
    assert data["candidates"][-1] == {"launcher": "local", "status": "chosen",
                                      "reason": "first match in precedence"}


def test_info_text_lists_sources_and_candidates() -> None:
    env = launcher_free_environ({"SLURM_JOB_ID": "77", "SLURM_NTASKS": "4",
                                 "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_PROCID": "0"})
    out = subprocess.run([*UNIRANK, "info"], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert "detected launcher 'slurm-allocation'" in out
    assert "planned_tasks    = 4   [SLURM_NTASKS]" in out
    assert "no srun step" in out
    assert "slurm            absent    not set: SLURM_STEP_ID" in out


def test_info_shows_the_cpus_this_process_may_use() -> None:
    """What ``--numa-binding``, ``taskset`` or ``srun --cpu-bind`` left this process."""
    if shutil.which("taskset") is None:
        pytest.skip("taskset is not installed")
    out = subprocess.run(["taskset", "-c", "0", *UNIRANK, "info"], env=launcher_free_environ(),
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "  cpus             = 0   [NUMA node 0]" in out.splitlines()


def test_info_bad_value_is_one_line_and_exit_2() -> None:
    env = launcher_free_environ({"RANK": "5", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    proc = subprocess.run([*UNIRANK, "info"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("unirank info: error: RANK='5': must be smaller than WORLD_SIZE=2")


def test_info_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from unirank.cli.main import main\n"
        "rc = main(['info', '--json'])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=launcher_free_environ(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.integration
def test_info_under_torchrun(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun")
    assert torchrun, "torchrun comes with torch"
    cmd = [torchrun, "--standalone", "--nproc_per_node", "2", "--no-python", "sh", "-c",
           f'"$0" -m unirank info --json > {tmp_path}/info.$RANK.json', sys.executable]
    subprocess.run(cmd, env=launcher_free_environ(), capture_output=True, text=True, timeout=120,
                   check=True)
    seen = [json.loads((tmp_path / f"info.{r}.json").read_text()) for r in (0, 1)]
    assert [d["launcher"] for d in seen] == ["torchrun", "torchrun"]
    assert [d["rank"] for d in seen] == [0, 1]
    assert {d["world_size"] for d in seen} == {2}
    assert [d["local_rank"] for d in seen] == [0, 1]
    assert len({(d["master_addr"], d["master_port"]) for d in seen}) == 1


@pytest.mark.mpi
def test_info_under_mpirun(tmp_path: Path, mpirun: list[str]) -> None:
    cmd = [*mpirun, "-np", "2", "sh", "-c",
           f'"$0" -m unirank info --json > {tmp_path}/info.$OMPI_COMM_WORLD_RANK.json',
           sys.executable]
    subprocess.run(cmd, env=launcher_free_environ(), capture_output=True, text=True, timeout=120,
                   check=True)
    seen = [json.loads((tmp_path / f"info.{r}.json").read_text()) for r in (0, 1)]
    assert [d["launcher"] for d in seen] == ["openmpi", "openmpi"]
    assert [(d["rank"], d["local_rank"], d["world_size"]) for d in seen] == [(0, 0, 2), (1, 1, 2)]
    assert {(d["master_addr"], d["num_nodes"]) for d in seen} == {("127.0.0.1", 1)}
    assert len({d["master_port"] for d in seen}) == 1


def test_info_says_which_run_options_the_pet_variables_set() -> None:
    env = launcher_free_environ({"PET_NNODES": "2", "PET_NODE_RANK": "1"})
    out = subprocess.run([*UNIRANK, "info"], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert ("unirank run (and torchrun) take from the environment: --nnodes 2 (PET_NNODES), "
            "--node-rank 1 (PET_NODE_RANK)") in out.splitlines()
