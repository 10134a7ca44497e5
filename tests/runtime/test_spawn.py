"""Parallel with real spawned workers and real gloo: collectives, failures, orphans, init timeout.

Every process is real; every wait has a timeout; nothing sleeps to synchronise.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

import pytest

from _procs import free_port, launcher_free_environ, wait_gone

pytestmark = pytest.mark.integration

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def run_script(
    name: str, *args: str, env: Optional[Mapping[str, str]] = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / name), *args], env=launcher_free_environ(env),
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )




def test_spawned_workers_run_every_collective(tmp_path: Path) -> None:
    proc = run_script("collectives_job.py", "3", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    results = sorted(
        (json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines()
         if line.startswith("RESULT ")),
        key=lambda r: r["rank"],
    )
    assert [r["rank"] for r in results] == [0, 1, 2]
    port = results[0]["env"]["MASTER_PORT"]
    for rank, r in enumerate(results):
        assert r["local_rank"] == rank
        assert (r["world"], r["local"], r["node"]) == (3, [rank, 3], [0, 1])
        assert (r["backend"], r["device"]) == ("gloo", "cpu")
        assert r["env"] == {
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "3",
            "LOCAL_WORLD_SIZE": "3", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1",
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }
        assert r["sum_tensor"] == [6.0]
        assert (r["sum"], r["mean"], r["min"], r["max"], r["product"]) == (6, 2.0, 1.5, 3, 6)
        assert r["mean_tensor"] == [1.0]
        assert r["gather_tensor"] == [0, 0, 1, 10, 2, 20]
        assert r["gather_scalar"] == [0, 1, 2]
        assert r["gather_number"] == [0.0, 0.5, 1.0]
        assert r["gather_str"] == ["r0", "r1", "r2"]
        assert r["gather_obj"] == [{"rank": i, "tuple": [i, "x"]} for i in range(3)]
        assert r["bcast_tensor"] == [1.0]
        assert (r["bcast_number"], r["bcast_str"], r["bcast_path"]) == (7, "from 1", "/who1")
        # any picklable object, as all_gather (a dict; an object of the script's own class)
        assert r["bcast_dict"] == {"from": 1, "list": [1, [1]]}  # JSON made the tuple a list
        assert r["bcast_dict_safe"] == {"from": 2}
        assert r["bcast_obj"] == {"x": 2, "tag": "p2"}
        assert r["only_zero"] == ("ran" if rank == 0 else None)
        # one_rank_first: rank 0 saw an empty folder, the others saw rank 0's file
        if rank == 0:
            assert r["seen_first"] == []
        else:
            assert "0" in r["seen_first"]
    assert proc.stdout.count("PRINT0 once") == 1
    for rank in range(3):
        assert f"[rank {rank}/3] INFO unirank.job: logged" in proc.stderr


@pytest.mark.parametrize(
    ("how", "code", "last_line"),
    [("exit", 3, "SystemExit: 3"), ("raise", 1, "ValueError: boom from rank 1")],
)
def test_failing_worker_is_named_and_the_others_are_stopped(
    how: str, code: int, last_line: str
) -> None:
    proc = run_script("failing_job.py", how)
    assert proc.returncode == 7, proc.stderr
    assert f"FAILED 1 1 {code}" in proc.stdout
    assert f"ERROR local rank 1 (rank 1) exited with code {code}: {last_line}" in proc.stdout
    pids = [int(line.split()[2]) for line in proc.stdout.splitlines() if line.startswith("PID ")]
    assert len(pids) == 2
    assert wait_gone(pids, timeout=10) == []


def read_lines_until(fd: int, prefix: str, count: int, timeout: float) -> list[str]:
    """Read ``fd`` (select + os.read, no sleeping) until ``count`` lines start with ``prefix``."""
    deadline = time.monotonic() + timeout
    buffer = b""
    found: list[str] = []
    while len(found) < count:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no {count} {prefix!r} lines in {timeout:g} s: {buffer!r}"
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            continue
        chunk = os.read(fd, 65536)
        assert chunk, f"output ended before {count} {prefix!r} lines: {buffer!r}"
        buffer += chunk
        lines = buffer.decode(errors="replace").splitlines()
        found = [line for line in lines if line.startswith(prefix)]
    return found


def test_workers_die_with_a_sigkilled_parent() -> None:
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "orphan_job.py")], env=launcher_free_environ(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, bufsize=0,
    )
    assert proc.stdout is not None
    ready: list[int] = []
    try:
        lines = read_lines_until(proc.stdout.fileno(), "READY ", 2, timeout=90)
        ready = [int(line.split()[1]) for line in lines]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert wait_gone(ready, timeout=15) == [], "workers outlived their SIGKILLed parent"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for pid in ready:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_two_nodes_of_spawned_workers_form_one_world() -> None:
    """Two Parallel(nproc_per_node=2, nnodes=2, node_rank=R) parents on this host: world 4."""
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPTS / "multinode_job.py"), str(node), port],
            env=launcher_free_environ(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            stdin=subprocess.DEVNULL,
        )
        for node in (0, 1)
    ]
    outputs: list[str] = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=30)
    rows = sorted(
        tuple(int(v) for v in line.split()[1:])
        for out in outputs for line in out.splitlines() if line.startswith("RESULT ")
    )
    # rank, world, node_rank, local_rank, sum
    assert rows == [(0, 4, 0, 0, 4), (1, 4, 0, 1, 4), (2, 4, 1, 0, 4), (3, 4, 1, 1, 4)]


def test_missing_rank_is_named_within_the_init_timeout() -> None:
    """Rank 0 of a torchrun-style world of 2 whose rank 1 never starts."""
    env = {
        "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
        "UNIRANK_INIT_TIMEOUT": "2",
    }
    code = "import unirank as ur\nur.init('gloo')\n"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=launcher_free_environ(env), capture_output=True,
        text=True,
        timeout=60, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "InitTimeoutError" in last
    assert "1 of 2 ranks did not join within 2 s: rank 1" in last


def test_unreachable_store_is_a_clear_error() -> None:
    """Rank 1 of a world whose agent store (TORCHELASTIC_USE_AGENT_STORE) never comes up: one
    line says so, once."""
    env = {
        "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
        "TORCHELASTIC_USE_AGENT_STORE": "True", "UNIRANK_INIT_TIMEOUT": "2",
    }
    code = "import unirank as ur\nur.init('gloo')\n"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=launcher_free_environ(env), capture_output=True,
        text=True,
        timeout=60, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("unirank.runtime.lifecycle.InitError: rank 1 could not reach the "
                           "rendezvous store at 127.0.0.1:")
    assert "within 2 s" in last
    # once: not again above as the StoreError it was made from ("direct cause")
    assert proc.stderr.count("could not reach the rendezvous store") == 1, proc.stderr


def test_user_created_group_is_used_under_torchrun() -> None:
    torchrun = shutil.which("torchrun")
    assert torchrun, "torchrun comes with torch"
    proc = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2",
         str(SCRIPTS / "user_group_job.py")],
        env=launcher_free_environ(), capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    rows = sorted(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    # ur.Parallel() adopted the script's group and left it initialised afterwards
    assert rows == ["RESULT 0 2 gloo 2 True", "RESULT 1 2 gloo 2 True"]


_PARENTS_JOB = """
import os, sys
import unirank as ur

def work(local_rank):
    print(f"PARENT {ur.get_rank()} {os.getppid()}", flush=True)

if __name__ == "__main__":
    print(f"SCRIPT {os.getpid()}", flush=True)
    with ur.Parallel(backend="gloo", nproc_per_node=2) as parallel:
        parallel.run(work)
"""


@pytest.mark.parametrize("preload", [True, False])
def test_parallel_forks_its_workers_from_the_fork_server(tmp_path: Path, preload: bool) -> None:
    """``Parallel`` starts its workers through the same engine as ``unirank run``: forked from
    one fork server (a child of the script), or, with UNIRANK_NO_PRELOAD=1, as the script's own
    children."""
    (tmp_path / "parents.py").write_text(_PARENTS_JOB)
    env = {} if preload else {"UNIRANK_NO_PRELOAD": "1"}
    proc = subprocess.run([sys.executable, str(tmp_path / "parents.py")], cwd=tmp_path,
                          env=launcher_free_environ(env, drop=("UNIRANK_NO_PRELOAD",)),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    script = int(proc.stdout.split("SCRIPT ", 1)[1].split()[0])
    parents = {int(line.split()[1]): int(line.split()[2]) for line in proc.stdout.splitlines()
               if line.startswith("PARENT ")}
    assert sorted(parents) == [0, 1], proc.stdout
    assert len(set(parents.values())) == 1, parents
    assert (next(iter(parents.values())) != script) is preload, (script, parents)
