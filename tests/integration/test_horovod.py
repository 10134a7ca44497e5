"""The horovod backend with the real Horovod 0.28.1 (gloo controller, ``scripts/setup --horovod``):
spawned by ``Parallel``/``unirank hello``, under ``horovodrun``, under ``unirank run``, and under
``srun`` on the testbed's two nodes with neither horovodrun nor MPI (unirank's own rendezvous),
under torchrun and under mpirun.

Every job runs ``scripts/backend_job.py``: collectives, ``auto_model`` (rank 0's weights win),
``auto_optim`` (one averaged step), ``auto_dataloader`` (shards by rank), each checked exactly.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from _procs import Runner, launcher_free_environ

pytestmark = pytest.mark.integration

JOB = str(Path(__file__).parent / "scripts" / "backend_job.py")
HOSTS = ["-H", "localhost:2"]


def run(cmd: list[str], timeout: float = 180, check: bool = True,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=launcher_free_environ(env))
    if check:
        assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def results(stdout: str) -> list[dict[str, Any]]:
    found = [json.loads(m) for m in re.findall(r"RESULT (\{.*\})", stdout)]
    return sorted(found, key=lambda r: r["rank"])


def check_job(stdout: str, world: int, local_world: int, nodes: int = 1) -> list[dict[str, Any]]:
    """Every rank's collectives and helpers gave exactly what they must on Horovod."""
    found = results(stdout)
    assert [r["rank"] for r in found] == list(range(world)), stdout
    total = world * (world + 1) // 2
    for r in found:
        rank = r["rank"]
        assert (r["backend"], r["world"], r["device"]) == ("horovod", world, "cpu")
        assert (r["sum"], r["mean"], r["min"], r["max"]) == (total, total / world, 1.5, world)
        product = 1
        for value in range(1, world + 1):
            product *= value
        assert r["product"] == product
        assert r["sum_tensor"] == [float(total)]
        assert r["gather_tensor"] == [v for i in range(world) for v in (i, 10 * i)]
        assert r["gather_scalar"] == list(range(world))
        assert r["gather_obj"] == [{"rank": i, "t": [i, "x"]} for i in range(world)]
        assert (r["bcast_tensor"], r["bcast_path"]) == ([float(world - 1)], f"/who{world - 1}")
        # Horovod's own view agrees: rank, size, local rank/size, node (cross) rank/size
        local_rank = r["local"][0]
        assert r["hvd"] == [rank, world, local_rank, local_world, rank // local_world, nodes]
        # auto_model: no DDP wrapper, rank 0's weights everywhere; auto_optim: Horovod's optimizer
        assert r["model"] == "Linear"
        assert len(set(r["initial"])) == 1 and len(r["initial"]) == world
        assert r["optimizer"] == "horovod.torch.optimizer.SGD"
        weight_step, bias_step = r["step"]
        mean_x = (world + 1) / 2  # dL/dW on rank k is k + 1: averaged over the ranks
        assert weight_step == pytest.approx([-0.1 * mean_x] * 6, abs=1e-6)
        assert bias_step == pytest.approx([-0.1, -0.1], abs=1e-6)
        assert len(set(r["after"])) == 1
        assert r["shard"] == list(range(rank, 4 * world, world))
    return found


def test_hello_and_reduce_print_the_seed_lines_with_horovod(horovodrun: str) -> None:
    hello = run([sys.executable, "-m", "unirank", "hello", "-n", "2", "--backend", "horovod"])
    lines = hello.stdout.splitlines()
    assert len(lines) == 2, hello.stdout
    for rank, line in enumerate(lines):
        assert re.fullmatch(rf"\[http://127\.0\.0\.1:\d+\] hello from \[[^:\]]+:horovod\] "
                            rf"process {rank}/2", line), line
    reduce = run([sys.executable, "-m", "unirank", "reduce", "-n", "2", "--backend", "horovod"])
    lines = reduce.stdout.splitlines()
    assert len(lines) == 2, reduce.stdout
    for rank, line in enumerate(lines):
        assert re.fullmatch(rf"\[http://127\.0\.0\.1:\d+\] \[[^:\]]+:horovod\] process {rank}/2 "
                            r"has data tensor\(\[2\.\]\)", line), line


def test_parallel_spawns_horovod_workers(horovodrun: str) -> None:
    check_job(run([sys.executable, JOB, "horovod", "3"]).stdout, world=3, local_world=3)


def test_under_horovodrun_auto_picks_horovod(horovodrun: str) -> None:
    out = run([horovodrun, "--gloo", "-np", "2", *HOSTS, sys.executable, JOB, "auto"]).stdout
    check_job(out, world=2, local_world=2)


def test_a_torch_backend_under_horovodrun(horovodrun: str) -> None:
    """horovodrun gives no MASTER_*: gloo meets at its rendezvous host on a derived port."""
    out = run([horovodrun, "--gloo", "-np", "2", *HOSTS, sys.executable, "-m", "unirank",
               "reduce", "--backend", "gloo"]).stdout
    assert sorted(re.findall(r"\[[^:\]]+:gloo\] process (\d)/2 has data tensor\(\[2\.\]\)",
                             out)) == ["0", "1"], out


def test_under_unirank_run(horovodrun: str) -> None:
    out = run(Runner.command(["-n", "2", JOB, "horovod"])).stdout
    check_job(out, world=2, local_world=2)


def test_under_srun_without_horovodrun_or_mpi(horovodrun: str, slurm_testbed: Any) -> None:
    """Two nodes, two tasks each: unirank serves Horovod's rendezvous; Horovod's local and cross
    ranks come out as a horovodrun -H node1:2,node2:2 would give them."""
    out = slurm_testbed.srun(["-N2", "--ntasks-per-node=2", sys.executable, JOB, "horovod"],
                             timeout=240).stdout
    check_job(out, world=4, local_world=2, nodes=2)


def test_hello_under_srun_names_both_nodes(horovodrun: str, slurm_testbed: Any) -> None:
    out = slurm_testbed.srun(["-N2", "--ntasks-per-node=1", sys.executable, "-m", "unirank",
                              "hello", "--backend", "horovod"], timeout=180).stdout
    found = re.findall(r"hello from \[(node\d):horovod\] process (\d)/2", out)
    assert sorted(found) == [("node1", "0"), ("node2", "1")], out


def test_a_failing_rank_ends_the_horovod_job(horovodrun: str, tmp_path: Path) -> None:
    """Rank 1 raises while rank 0 waits in an allreduce: the job ends, naming rank 1."""
    script = tmp_path / "fail.py"
    script.write_text(
        "import torch, unirank as ur\n"
        "def body(local_rank):\n"
        "    if ur.get_rank() == 1:\n"
        "        raise ValueError('rank 1 gives up')\n"
        "    ur.all_reduce(torch.ones(1))\n"
        "if __name__ == '__main__':\n"
        "    with ur.Parallel(backend='horovod', nproc_per_node=2) as p:\n"
        "        p.run(body)\n"
    )
    proc = run([sys.executable, str(script)], check=False)
    assert proc.returncode == 1, proc.stderr
    assert "ValueError: rank 1 gives up" in proc.stderr
    assert "local rank 1 (rank 1)" in proc.stderr


def test_under_torchrun(horovodrun: str) -> None:
    """torchrun's agent serves the store: the ranks meet there, then in Horovod."""
    out = run([sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", JOB, "horovod"]).stdout
    check_job(out, world=2, local_world=2)


def test_under_mpirun_with_a_gloo_only_horovod(horovodrun: str, mpirun: list[str]) -> None:
    """This Horovod has no MPI controller: under mpirun unirank's gloo rendezvous is used."""
    out = run([*mpirun, "-np", "2", sys.executable, JOB, "horovod"]).stdout
    check_job(out, world=2, local_world=2)
