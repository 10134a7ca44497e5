"""A real two-node Ray cluster on loopback (``ray start --head`` at 127.0.0.1 and a second node
at 127.0.0.2) runs a Ray Train ``TorchTrainer`` whose function is written with ``import unirank
as ur`` (tests/integration/scripts/ray_train.py). Ray starts the process group before the
function: ``ur.init()`` adopts it (and starts the hang watcher for it), and the function trains to
the same loss as under ``unirank run -n 2``.

Nothing can leave the machine: both nodes and the driver run in a network namespace of their own
that has only ``lo`` (``unshare --net``, held by a process of the fixture; each command enters it
with ``nsenter --net``; root only), where 127.0.0.2 is routed on ``lo`` as 127.0.0.1 is. A Ray node
outside such a namespace, even one given ``--node-ip-address 127.0.0.1``, has been seen handing
its workers the host's own interface address as ``MASTER_ADDR`` (not in every run); the test
asserts that the ``MASTER_ADDR`` each Ray worker saw (and ``ur.dist_env()`` detected) is a
loopback address.
``ray start`` gets, in the namespace as outside it: ``--node-ip-address`` (the node's loopback
address), ``--num-cpus 1``, ``--include-dashboard=false`` (head), ``--disable-usage-stats``,
``--dashboard-agent-listen-port`` (a port of its own per node: both share the namespace),
``--temp-dir`` (a short folder of its own: unix socket paths), ``--block``; and the environment
``RAY_USAGE_STATS_ENABLED=0``, ``RAY_AUTH_MODE=disabled`` (no token for a cluster of one test),
``RAY_DEDUP_LOGS=0``. Nothing more is needed in the namespace.

In CI (``CI=true``) a missing Ray, or a missing piece of the namespace (root, ``unshare``,
``nsenter``, ``ip``), is a failure; elsewhere the test skips with one line. The cluster is always
stopped in teardown: each ``ray start --block`` runs in a session of its own, and every process
of those sessions is SIGKILLed (Ray's own stop on SIGTERM takes about 16 s a node and proves
nothing here); then every process still in the namespace is SIGKILLed, the holder ends (and the
namespace with it), and the test fails unless every one of them is gone."""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
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

from _procs import free_port, launcher_free_environ, read_lines, unavailable, wait_gone

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
    """Kill ``ray start --block`` and every process of its session."""
    for pid in [proc.pid, *_session_members(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _namespace_members(link: str) -> list[int]:
    """The processes whose network namespace is ``link`` (what ``/proc/PID/ns/net`` reads)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/net") == link:
                    members.append(int(entry))
    return members


@contextlib.contextmanager
def _loopback_namespace() -> Iterator[list[str]]:
    """A network namespace of its own that has only ``lo`` (up): yields the command prefix that
    runs a command in it. A holder process (``unshare --net``) keeps it; at the end every
    process still in it is SIGKILLed, and the test fails unless all of them are gone."""
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "nsenter", "ip")):
        unavailable("a loopback-only network namespace needs root, unshare, nsenter and ip")
    holder = subprocess.Popen(
        ["unshare", "--net", "sh", "-c", "ip link set lo up && echo up && exec cat"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert holder.stdin is not None and holder.stdout is not None
    link = ""
    try:
        assert holder.stdout.readline() == "up\n", "the network namespace failed"
        link = os.readlink(f"/proc/{holder.pid}/ns/net")
        assert link != os.readlink("/proc/self/ns/net")
        prefix = ["nsenter", f"--net=/proc/{holder.pid}/ns/net"]
        links = subprocess.run([*prefix, "ip", "-o", "link", "show"], capture_output=True,
                               text=True, timeout=30, check=True).stdout
        assert [line.split(":")[1].strip() for line in links.splitlines()] == ["lo"], links
        yield prefix
    finally:
        left = [pid for pid in _namespace_members(link) if pid != holder.pid] if link else []
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        holder.stdin.close()
        holder.wait(timeout=30)
        holder.stdout.close()
        assert not wait_gone(left), f"processes left in the namespace: {left}"


@pytest.fixture
def ray_cluster() -> Iterator[tuple[str, list[str]]]:
    """A head at 127.0.0.1 and a second node at 127.0.0.2, both in a network namespace that
    has only ``lo``; yields the head's address and the prefix that runs a command there."""
    ray = _ray_command()
    env = launcher_free_environ(RAY_ENV)
    port = free_port()
    common = ["--block", "--num-cpus", "1", "--disable-usage-stats",
              "--dashboard-agent-listen-port", str(free_port())]
    procs: list[subprocess.Popen[bytes]] = []
    with _loopback_namespace() as inside:
        temp = tempfile.mkdtemp(prefix="ur-ray-", dir="/tmp")  # unix socket paths stay short
        starts = [
            [ray, "start", "--head", "--port", str(port), "--include-dashboard=false",
             "--node-ip-address", NODES[0], "--temp-dir", temp, *common],
            [ray, "start", "--address", f"{NODES[0]}:{port}", "--node-ip-address", NODES[1],
             *common[:-1], str(free_port())],
        ]
        try:
            for command in starts:
                proc = subprocess.Popen([*inside, *command], env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
                procs.append(proc)
                assert proc.stdout is not None
                read_lines(proc.stdout, 1, contains="Ray runtime started", timeout=TIMEOUT)
            yield f"{NODES[0]}:{port}", inside
        finally:
            for proc in reversed(procs):
                _stop(proc)
                if proc.stdout is not None:
                    proc.stdout.close()
            shutil.rmtree(temp, ignore_errors=True)


def _records(out: Path) -> list[dict[str, object]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_ray_train_function_trains_to_the_unirank_run_loss(tmp_path: Path,
                                                           ray_cluster: tuple[str, list[str]]
                                                           ) -> None:
    address, inside = ray_cluster
    ray_out, run_out = tmp_path / "ray", tmp_path / "run"
    ray_out.mkdir()
    run_out.mkdir()
    driver = subprocess.run([*inside, sys.executable, str(SCRIPT), str(ray_out), "--ray",
                             address], env=launcher_free_environ(RAY_ENV),
                            capture_output=True, text=True, timeout=TIMEOUT)
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
    # every address Ray gave its workers is a loopback one (a node may hand out its host's own
    # interface address otherwise)
    for record in under_ray:
        assert record["MASTER_ADDR"] == record["master_addr"], record
        assert ipaddress.ip_address(str(record["MASTER_ADDR"])).is_loopback, record
    losses = {r["loss"] for r in under_ray + under_run}
    assert len(losses) == 1, (under_ray, under_run)
