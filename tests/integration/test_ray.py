"""A real two-node Ray cluster on loopback (``ray start --head`` at 127.0.0.1 and a second node
at 127.0.0.2, one CPU each, no dashboard, ports from the free range, a temporary directory of
its own, token authentication off: nothing leaves the machine) runs a Ray Train
``TorchTrainer`` whose function is written with ``import unirank as ur``
(tests/integration/scripts/ray_train.py). Ray starts the process group before the function:
``ur.init()`` adopts it (and starts the hang watcher for it), and the function trains to the
same loss as under ``unirank run -n 2``.

In CI (``CI=true``) a missing Ray is a failure; elsewhere the test skips with one line. The
cluster is always stopped in teardown: each ``ray start --block`` runs in a session of its own,
gets SIGTERM (it stops what it started), and anything left in its session is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from _procs import free_port, launcher_free_environ, read_lines, unavailable

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parent / "scripts" / "ray_train.py"
TIMEOUT = 240.0
NODES = ("127.0.0.1", "127.0.0.2")
#: no usage report, no token (a loopback cluster of one test), the workers' lines not merged
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "RAY_DEDUP_LOGS": "0"}


def _ray_command() -> str:
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.train") is None:
        unavailable("Ray Train is not installed (pip install 'ray[train]==2.60.0', the test "
                    "extra)")
    found = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    if found is None:
        unavailable("the ray command is not on PATH")
    return found


def _session_members(sid: int) -> list[int]:
    """The processes whose session id is ``sid``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == sid and int(entry) != sid:
            members.append(int(entry))
    return members


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """``ray start --block`` stops its processes on SIGTERM; then anything left in its
    session is killed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    for pid in _session_members(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def ray_cluster() -> Iterator[str]:
    """A head at 127.0.0.1 and a second node at 127.0.0.2; yields the head's address."""
    ray = _ray_command()
    temp = tempfile.mkdtemp(prefix="ur-ray-", dir="/tmp")  # unix socket paths stay short
    env = launcher_free_environ(RAY_ENV)
    port = free_port()
    common = ["--block", "--num-cpus", "1", "--disable-usage-stats",
              "--dashboard-agent-listen-port", str(free_port())]
    starts = [
        [ray, "start", "--head", "--port", str(port), "--include-dashboard=false",
         "--node-ip-address", NODES[0], "--temp-dir", temp, *common],
        [ray, "start", "--address", f"{NODES[0]}:{port}", "--node-ip-address", NODES[1],
         *common[:-1], str(free_port())],
    ]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for command in starts:
            proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            procs.append(proc)
            assert proc.stdout is not None
            read_lines(proc.stdout, 1, contains="Ray runtime started", timeout=TIMEOUT)
        yield f"{NODES[0]}:{port}"
    finally:
        for proc in reversed(procs):
            _stop(proc)
            if proc.stdout is not None:
                proc.stdout.close()
        shutil.rmtree(temp, ignore_errors=True)


def _records(out: Path) -> list[dict[str, object]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_ray_train_function_trains_to_the_unirank_run_loss(tmp_path: Path,
                                                           ray_cluster: str) -> None:
    ray_out, run_out = tmp_path / "ray", tmp_path / "run"
    ray_out.mkdir()
    run_out.mkdir()
    driver = subprocess.run([sys.executable, str(SCRIPT), str(ray_out), "--ray", ray_cluster],
                            env=launcher_free_environ(RAY_ENV), capture_output=True, text=True,
                            timeout=TIMEOUT)
    assert driver.returncode == 0, driver.stdout + driver.stderr
    direct = subprocess.run([sys.executable, "-m", "unirank", "run", "-n", "2", str(SCRIPT),
                             str(run_out)], env=launcher_free_environ(), capture_output=True,
                            text=True, timeout=TIMEOUT)
    assert direct.returncode == 0, direct.stderr
    under_ray, under_run = _records(ray_out), _records(run_out)
    for records in (under_ray, under_run):
        assert [(r["rank"], r["world"], r["device"]) for r in records] == \
            [(0, 2, "cpu"), (1, 2, "cpu")]
        assert [bool(r["printed"]) for r in records] == [True, False]  # print0: rank 0 only
        assert all(r["watcher"] for r in records), records
    # Ray made the group (and the ranks' variables); ur.init adopted it
    assert [r["group_existed"] for r in under_ray] == [True, True]
    assert [r["group_existed"] for r in under_run] == [False, False]
    assert [(r["node_rank"], r["local_rank"], r["local_world_size"]) for r in under_ray] == \
        [(0, 0, 1), (1, 0, 1)], under_ray
    losses = {r["loss"] for r in under_ray + under_run}
    assert len(losses) == 1, (under_ray, under_run)
