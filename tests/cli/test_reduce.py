"""``unirank reduce``: every rank prints the seed's line with the sum of ones, the world size."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys

import pytest

from _procs import free_port, launcher_free_environ

HOST = socket.gethostname()


def test_reduce_serial_has_one() -> None:
    proc = subprocess.run([sys.executable, "-m", "unirank", "reduce"],
                          env=launcher_free_environ({"MASTER_PORT": "29517"}), capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"[http://127.0.0.1:29517] [{HOST}:gloo] process 0/1 has data tensor([1.])"
    ]


@pytest.mark.integration
def test_reduce_with_spawned_workers_sums_to_the_world_size() -> None:
    port = free_port()
    proc = subprocess.run([sys.executable, "-m", "unirank", "reduce", "-n", "3"],
                          env=launcher_free_environ({"MASTER_PORT": str(port)}),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"[http://127.0.0.1:{port}] [{HOST}:gloo] process {rank}/3 has data tensor([3.])"
        for rank in range(3)
    ]


@pytest.mark.integration
def test_reduce_under_torchrun() -> None:
    torchrun = shutil.which("torchrun")
    assert torchrun, "torchrun comes with torch"
    port = free_port()
    proc = subprocess.run(
        [torchrun, "--nproc_per_node", "2", "--master_port", str(port), "--no-python",
         sys.executable, "-m", "unirank", "reduce"],
        env=launcher_free_environ(), capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[http")]
    assert lines == [
        f"[http://127.0.0.1:{port}] [{HOST}:gloo] process {rank}/2 has data tensor([2.])"
        for rank in range(2)
    ]
