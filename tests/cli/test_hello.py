"""``unirank hello``: the seed's exact lines, serial and with spawned workers; clear errors."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Optional

import pytest

from _procs import free_port, launcher_free_environ

if TYPE_CHECKING:
    from conftest import SlurmTestbed

UNIRANK = [sys.executable, "-m", "unirank"]
HOST = socket.gethostname()


def run_unirank(
    *args: str, env: Optional[Mapping[str, str]] = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``unirank ARGS`` in this environment minus any launcher's variables, plus ``env``."""
    return subprocess.run([*UNIRANK, *args], env=launcher_free_environ(env), capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_hello_serial_is_process_0_of_1() -> None:
    proc = run_unirank("hello", env={"MASTER_PORT": "29513"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"[http://127.0.0.1:29513] hello from [{HOST}:gloo] process 0/1"
    ]


def test_hello_uses_the_slurm_node_name() -> None:
    proc = run_unirank("hello", "--backend", "gloo", env={"SLURMD_NODENAME": "node7"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "[http://127.0.0.1:29500] hello from [node7:gloo] process 0/1"
    ]


@pytest.mark.integration
def test_hello_spawns_n_workers_in_rank_order() -> None:
    port = free_port()
    proc = run_unirank("hello", "-n", "3", env={"MASTER_PORT": str(port)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"[http://127.0.0.1:{port}] hello from [{HOST}:gloo] process {rank}/3"
        for rank in range(3)
    ]
    assert "ignite.distributed.launcher" not in proc.stderr, proc.stderr  # a report, no log


@pytest.mark.integration
def test_hello_is_in_rank_order_across_two_nodes_of_srun(slurm_testbed: SlurmTestbed) -> None:
    """srun relays each task's output on its own: only gathering the lines keeps the order
    (printing in turns, with a barrier after each, gave 0, 2, 1, 3 here)."""
    for _ in range(3):
        out = slurm_testbed.srun(["-N2", "--ntasks-per-node=2", *UNIRANK, "hello"],
                                 env={"UNIRANK_INIT_TIMEOUT": "60"}, timeout=120).stdout
        lines = out.splitlines()
        found = [re.search(r"\] hello from \[(node\d):gloo\] process (\d)/4$", line)
                 for line in lines]
        assert all(found) and len(lines) == 4, out
        assert [(m[1], int(m[2])) for m in found if m] == [
            ("node1", 0), ("node1", 1), ("node2", 2), ("node2", 3)], out


def test_hello_nccl_without_cuda_is_a_one_line_error() -> None:
    proc = run_unirank("hello", "--backend", "nccl")
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("unirank hello: error: backend='nccl': the nccl backend needs CUDA")


def test_hello_bad_worker_count_is_a_one_line_error() -> None:
    proc = run_unirank("hello", "-n", "0")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "unirank hello: error: nproc_per_node='0': must be an integer >= 1 "
        "HINT: pass nproc_per_node=<integer >= 1>"
    )


@pytest.mark.integration
def test_hello_names_the_rank_that_never_joined() -> None:
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
           "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "UNIRANK_INIT_TIMEOUT": "2"}
    proc = run_unirank("hello", env=env)
    assert proc.returncode == 1
    # (torch's c10d may log its own store-timeout warnings first)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("unirank hello: error: rank 0: init timeout: 1 of 2 ranks did not "
                               "join within 2 s: rank 1.")


def test_hello_module_does_not_import_torch() -> None:
    code = ("import sys, argparse\nimport unirank.cli.hello as h, unirank.cli.reduce as r, "
            "unirank.cli.check as c\np = argparse.ArgumentParser()\nh.add_arguments(p)\n"
            "assert 'torch' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
