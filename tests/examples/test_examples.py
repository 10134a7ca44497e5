"""The examples run unchanged under python, torchrun, torch.distributed.launch, mpirun and Slurm.

Each run is real (real processes, real gloo, the real launcher); outputs are the seeds' lines.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import pytest

from _procs import Runner, free_port, launcher_free_environ

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HELLO = str(EXAMPLES / "helloworld.py")
REDUCTION = str(EXAMPLES / "reduction.py")
CHECK = str(EXAMPLES / "check_config.py")
HOST = socket.gethostname()
LINE = re.compile(r"^\[http://(?P<addr>[^:\]]+):(?P<port>\d+)\] ")


def run(cmd: Sequence[str], env: Optional[Mapping[str, str]] = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(cmd), env=launcher_free_environ(env), capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def seed_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if LINE.match(line)]


def hello_lines(addr: str, port: Any, nodes: Sequence[str], world: int) -> list[str]:
    return [f"[http://{addr}:{port}] hello from [{nodes[r]}:gloo] process {r}/{world}"
            for r in range(world)]


def reduce_lines(addr: str, port: Any, nodes: Sequence[str], world: int) -> list[str]:
    return [f"[http://{addr}:{port}] [{nodes[r]}:gloo] process {r}/{world} has data "
            f"tensor([{world}.])" for r in range(world)]


def test_hello_serial() -> None:
    proc = run([sys.executable, HELLO, "--backend", "gloo"], env={"MASTER_PORT": "29531"})
    assert seed_lines(proc.stdout) == hello_lines("127.0.0.1", 29531, [HOST], 1)


def test_reduction_serial() -> None:
    proc = run([sys.executable, REDUCTION], env={"MASTER_PORT": "29532"})
    assert seed_lines(proc.stdout) == reduce_lines("127.0.0.1", 29532, [HOST], 1)


@pytest.mark.parametrize(("script", "expected"), [(HELLO, hello_lines), (REDUCTION, reduce_lines)])
def test_spawning_local_workers(script: str, expected: Any) -> None:
    port = free_port()
    proc = run([sys.executable, script, "--nproc-per-node", "2"], env={"MASTER_PORT": str(port)})
    assert seed_lines(proc.stdout) == expected("127.0.0.1", port, [HOST] * 2, 2)


@pytest.mark.parametrize(("script", "expected"), [(HELLO, hello_lines), (REDUCTION, reduce_lines)])
def test_under_torchrun(script: str, expected: Any) -> None:
    torchrun = shutil.which("torchrun")
    assert torchrun, "torchrun comes with torch"
    port = free_port()
    proc = run([torchrun, "--nproc_per_node", "2", "--master_port", str(port), script,
                "--backend", "gloo"])
    assert seed_lines(proc.stdout) == expected("127.0.0.1", port, [HOST] * 2, 2)


def test_under_legacy_torch_distributed_launch() -> None:
    """torch.distributed.launch (deprecated, still shipped) passes ``--local-rank=N``."""
    port = free_port()
    proc = run([sys.executable, "-m", "torch.distributed.launch", "--nproc_per_node", "2",
                "--master_port", str(port), HELLO])
    assert seed_lines(proc.stdout) == hello_lines("127.0.0.1", port, [HOST] * 2, 2)


def test_check_config_under_python() -> None:
    proc = run([sys.executable, CHECK])
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("torch version : ")
    assert lines[1].startswith("torch git version : ")
    assert "launcher : local" in lines


def test_hello_under_mpirun_np4(mpirun: list[str]) -> None:
    """Seed 004, as the SuperCloud batch script does: master address and port given to every
    rank with ``-x``, four ranks."""
    port = free_port()
    proc = run([*mpirun, "-np", "4", "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={port}",
                sys.executable, HELLO, "--backend", "gloo"])
    assert sorted(seed_lines(proc.stdout)) == hello_lines("127.0.0.1", port, [HOST] * 4, 4)


def test_reduction_under_mpirun_on_one_host(mpirun: list[str]) -> None:
    """Without MASTER_ADDR: on one host the master is 127.0.0.1, the port from mpirun's job id."""
    proc = run([*mpirun, "-np", "2", sys.executable, REDUCTION])
    lines = sorted(seed_lines(proc.stdout))
    match = LINE.match(lines[0])
    assert match is not None
    assert lines == reduce_lines("127.0.0.1", match["port"], [HOST] * 2, 2)


def _master(lines: list[str]) -> tuple[str, str]:
    match = LINE.match(lines[0])
    assert match is not None
    return match["addr"], match["port"]


def test_reduction_under_srun_two_nodes(slurm_testbed: Any) -> None:
    proc = slurm_testbed.srun(["-N2", "--ntasks-per-node=2", sys.executable, REDUCTION],
                              timeout=120)
    lines = sorted(seed_lines(proc.stdout))
    addr, port = _master(lines)
    assert addr == "node1"
    assert lines == reduce_lines(addr, port, ["node1", "node1", "node2", "node2"], 4)


def test_hello_srun_one_task_per_node_spawning_workers(slurm_testbed: Any) -> None:
    """Seed 003's pattern: one Slurm task per node, each spawning one worker per GPU."""
    proc = slurm_testbed.srun(["-N2", "--ntasks-per-node=1", sys.executable, HELLO,
                               "--nproc-per-node", "2"], timeout=120)
    lines = sorted(seed_lines(proc.stdout))
    addr, port = _master(lines)
    assert addr == "node1"
    assert lines == hello_lines(addr, port, ["node1", "node1", "node2", "node2"], 4)


def test_hello_in_a_batch_shell_without_srun_fails_fast_naming_srun(slurm_testbed: Any) -> None:
    result = slurm_testbed.sbatch_and_wait(
        f"{sys.executable} {HELLO}\n", timeout=120, args=["-N2", "--ntasks-per-node=2"]
    )
    assert result.exit_code != 0
    assert "no task was launched" in result.output
    assert f"HINT: start the tasks with: srun {Path(sys.executable).name} {HELLO}" in result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("helloworld.py: error: SLURM_STEP_ID=<unset>")


QUICKSTART = str(EXAMPLES / "quickstart.py")


def test_readme_quickstart_serial_and_under_unirank_run() -> None:
    """README's quick start, as README shows it: serial, then two workers under unirank run;
    its one line is all it prints (no log line of ignite's on stderr)."""
    serial = run([sys.executable, QUICKSTART])
    assert serial.stdout.splitlines() == ["world=1 sum=1.0 backend=gloo device=cpu"]
    assert serial.stderr == ""
    launched = run(Runner.command(["-n", "2", QUICKSTART]))
    assert launched.stdout.splitlines() == ["world=2 sum=2.0 backend=gloo device=cpu"]
    assert launched.stderr == ""
