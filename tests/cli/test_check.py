"""``unirank check`` and its pure report (:mod:`unirank.report`).

The report functions take torch's facts as a value: the CUDA devices in the first tests are
simulated (this machine has no GPU); the command-line tests use the real torch.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from _procs import launcher_free_environ
from unirank.distenv import DistEnv
from unirank.envvars import looks_secret
from unirank.report import TorchFacts, build_report, format_report, masked

CPU = TorchFacts(version="2.13.0+cpu", git_version="abc123", cuda_available=False,
                 cuda_version=None)
GPU = TorchFacts(
    version="2.13.0+cu128", git_version="abc123", cuda_available=True, cuda_version="12.8",
    devices=(
        "_CudaDeviceProperties(name='Tesla P100-PCIE-16GB', major=6, minor=0, "
        "total_memory=16280MB, multi_processor_count=56)",
        "_CudaDeviceProperties(name='Tesla P100-PCIE-16GB', major=6, minor=0, "
        "total_memory=16280MB, multi_processor_count=56)",
    ),
)
LOCAL = DistEnv(launcher="local", node_name="box", hosts=("box",))
SLURM_TASK = DistEnv(
    launcher="slurm", rank=1, local_rank=1, world_size=4, local_world_size=2, num_nodes=2,
    master_addr="node1", master_port=20061, job_id="5", step_id="1", node_name="node1",
    hosts=("node1", "node2"),
)
SLURM_ENV = {"SLURM_JOB_ID": "5", "SLURM_JOBID": "5", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
             "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "node[1-2]"}


def test_cpu_report_lines() -> None:
    lines = format_report(build_report(CPU, {}, LOCAL))
    assert lines == [
        "torch version : 2.13.0+cpu",
        "torch git version : abc123",
        "no cuda available",
        "launcher : local",
        "rank : 0",
        "local_rank : 0",
        "world_size : 1",
        "local_world_size : 1",
        "node_rank : 0",
        "num_nodes : 1",
        "master_addr : 127.0.0.1",
        "master_port : 29500",
        "job_id : -",
        "step_id : -",
        "node_name : box",
        "hosts : box",
        "tasks_per_node : -",
        "launch_required : False",
        "planned_tasks : -",
        "no NCCL_*/GLOO_*/TORCH_* variables set",
    ]


def test_gpu_and_slurm_lines_follow_the_seed() -> None:
    lines = list(format_report(build_report(GPU, SLURM_ENV, SLURM_TASK)))
    assert lines[:13] == [
        "torch version : 2.13.0+cu128",
        "torch git version : abc123",
        "torch version cuda : 12.8",
        "number of cuda device(s) : 2",
        f"- device 0 : {GPU.devices[0]}",
        f"- device 1 : {GPU.devices[1]}",
        "SLURM_PROCID : 1",
        "SLURM_LOCALID : 1",
        "SLURM_NTASKS : 4",
        "SLURM_JOB_NODELIST : node[1-2]",
        "hostnames : node1 node2",
        "launcher : slurm",
        "rank : 1",
    ]
    assert "hosts : node1,node2" in lines
    assert "master_port : 20061" in lines


def test_slurm_section_with_missing_and_bad_values() -> None:
    environ = {"SLURM_JOBID": "9", "SLURM_JOB_NODELIST": "node[1-"}
    lines = format_report(build_report(CPU, environ, LOCAL))
    assert "SLURM_PROCID : <unset>" in lines
    bad = [line for line in lines if line.startswith("hostnames : ")]
    assert len(bad) == 1
    assert bad[0].startswith("hostnames : error: SLURM_JOB_NODELIST='node[1-'")


@pytest.mark.parametrize(
    ("name", "secret"),
    [("NCCL_DEBUG", False), ("TORCH_HUB_TOKEN", True), ("GLOO_API_KEY", True),
     ("TORCH_SECRET_X", True), ("NCCL_password", True), ("TORCH_KEYRING", True),
     ("GLOO_SOCKET_IFNAME", False)],
)
def test_secret_names(name: str, secret: bool) -> None:
    assert looks_secret(name) is secret
    assert masked(name, "v") == ("****" if secret else "v")


def test_variables_are_listed_sorted_and_masked() -> None:
    environ = {"TORCH_HUB_TOKEN": "hf_abc", "NCCL_DEBUG": "INFO", "GLOO_SOCKET_IFNAME": "eth0",
               "PATH": "/bin", "NCCL_IB_HCA": "mlx5", "MY_TORCH_THING": "x"}
    report = build_report(CPU, environ, LOCAL)
    assert report["variables"] == {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "INFO",
                                   "NCCL_IB_HCA": "mlx5", "TORCH_HUB_TOKEN": "****"}
    assert list(format_report(report))[-4:] == [
        "GLOO_SOCKET_IFNAME : eth0", "NCCL_DEBUG : INFO", "NCCL_IB_HCA : mlx5",
        "TORCH_HUB_TOKEN : ****",
    ]
    assert "hf_abc" not in json.dumps(report)


def test_detection_error_is_reported() -> None:
    report = build_report(CPU, {}, None, "RANK='5': must be smaller than WORLD_SIZE=2")
    assert report["dist_env"] is None
    assert "launcher : error: RANK='5': must be smaller than WORLD_SIZE=2" in format_report(report)


def run_check(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    # the report lists NCCL_*, GLOO_* and TORCH_* variables: none from the shell running pytest
    env = launcher_free_environ(extra, drop_prefixes=("NCCL_", "GLOO_", "TORCH_"))
    return subprocess.run([sys.executable, "-m", "unirank", "check", *args], env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_check_command_prints_the_seed_lines_then_unirank_lines() -> None:
    import torch

    proc = run_check(NCCL_DEBUG="WARN", TORCH_HUB_TOKEN="hf_secret")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == [f"torch version : {torch.version.__version__}",
                         f"torch git version : {torch.version.git_version}"]
    if not torch.cuda.is_available():
        assert lines[2] == "no cuda available"
    assert "launcher : local" in lines
    assert lines[-2:] == ["NCCL_DEBUG : WARN", "TORCH_HUB_TOKEN : ****"]
    assert "hf_secret" not in proc.stdout


def test_check_command_json_in_an_allocation_shell() -> None:
    proc = run_check("--json", SLURM_JOB_ID="77", SLURM_JOBID="77", SLURM_NTASKS="4",
                     SLURM_JOB_NODELIST="node[1-2]", SLURM_PROCID="0", SLURM_LOCALID="0",
                     GLOO_SOCKET_IFNAME="lo")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["slurm"]["hostnames"] == ["node1", "node2"]
    assert data["slurm"]["SLURM_NTASKS"] == "4"
    assert data["launcher"] == "slurm-allocation"
    assert data["dist_env"]["launch_required"] is True
    assert data["variables"] == {"GLOO_SOCKET_IFNAME": "lo"}


def test_check_command_reports_a_detection_error_and_exits_1() -> None:
    proc = run_check(RANK="5", WORLD_SIZE="2", LOCAL_RANK="0")
    assert proc.returncode == 1
    assert "launcher : error: RANK='5': must be smaller than WORLD_SIZE=2" in proc.stdout
