"""``unirank run --hosts`` over real ssh between the testbed's node1 (127.0.1.1) and node2
(127.0.1.2): each node has its own sshd (scripts/testbed), the job runs one ``unirank run`` per
host through OpenSSH's client.

What is checked: the world and the hello lines of four ranks on two hosts; a failure on one host
ends both with its exit code and names the host; SIGINT and SIGKILL to the local launcher leave
no worker on either host (by the pids the workers write); an unreachable or unknown host is
refused in one line before any worker starts; which variables reach the hosts; ``unirank
doctor --hosts``; with ``--nnodes MIN:MAX`` (elastic), a host whose whole tree is killed is
survived.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _outputs import EXAMPLES

from _procs import Runner, process_tree

pytestmark = [pytest.mark.ssh, pytest.mark.slurm, pytest.mark.integration]

HOSTS = ["--hosts", "node1:2,node2:2"]

#: every rank writes its pid and its parent's into the folder argv[1], says "ready", then
#: waits; the rank named by argv[2] (if any) exits with code argv[3] once all four are ready
HOLD = """
import os, sys, threading
folder = sys.argv[1]
rank = int(os.environ["RANK"])
with open(os.path.join(folder, f"pids.{rank}"), "w") as f:
    f.write(f"{os.getpid()} {os.getppid()}")
print(f"ready {rank}", flush=True)
if len(sys.argv) > 2 and rank == int(sys.argv[2]):
    import time
    while len([n for n in os.listdir(folder) if n.startswith("pids.")]) < 4:
        time.sleep(0.05)  # polls the other ranks' files: a condition, with the test's timeout
    sys.exit(int(sys.argv[3]))
threading.Event().wait(120)
"""


def _pids(folder: Path) -> list[int]:
    pids = []
    for path in sorted(folder.glob("pids.*")):
        pids += [int(p) for p in path.read_text().split()]
    return pids


def test_quickstart_on_two_hosts_has_a_world_of_four(runner: Runner,
                                                     ssh_testbed: list[str]) -> None:
    result = runner.run([*HOSTS, *ssh_testbed, str(EXAMPLES / "quickstart.py")])
    assert result.returncode == 0, result.stderr
    assert "world=4 sum=4.0" in result.stdout


def test_hello_comes_from_every_rank_in_rank_order_naming_its_host(
        runner: Runner, ssh_testbed: list[str]) -> None:
    result = runner.run([*HOSTS, *ssh_testbed, str(EXAMPLES / "helloworld.py"),
                         "--backend", "gloo"])
    assert result.returncode == 0, result.stderr
    hellos = re.findall(r"hello from \[(\w+):gloo\] process (\d)/(\d)", result.stdout)
    # each host's lines come through its own ssh stream, in rank order; the turns of two
    # streams may interleave on the way (a barrier orders the prints, not their relay)
    assert sorted(hellos) == [("node1", "0", "4"), ("node1", "1", "4"), ("node2", "2", "4"),
                              ("node2", "3", "4")], result.stdout
    for host in ("node1", "node2"):
        ranks = [rank for name, rank, _ in hellos if name == host]
        assert ranks == sorted(ranks), result.stdout


def test_a_failing_rank_ends_both_hosts_with_its_exit_code_naming_the_host(
        runner: Runner, ssh_testbed: list[str], tmp_path: Path) -> None:
    script = runner.script("hold.py", HOLD)
    result = runner.run([*HOSTS, *ssh_testbed, str(script), str(tmp_path), "3", "3"])
    assert result.returncode == 3, result.stderr
    assert "host node2 (node rank 1) ended the job: unirank run failed with exit code 3" \
        in result.stderr
    assert "rank 3 (local rank 1) on node node2: exit code 3" in result.stderr
    assert len(_pids(tmp_path)) == 8
    assert runner.wait_gone(_pids(tmp_path)) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL])
def test_a_signal_to_the_launcher_leaves_no_process_on_either_host(
        runner: Runner, ssh_testbed: list[str], tmp_path: Path, signum: int) -> None:
    script = runner.script("hold.py", HOLD)
    proc = runner.start([*HOSTS, *ssh_testbed, str(script), str(tmp_path)])
    assert proc.stdout is not None
    runner.read_lines(proc.stdout, 4, contains="ready")
    pids = _pids(tmp_path)
    assert len(pids) == 8  # four workers and their parents (fork servers)
    proc.send_signal(signum)
    _out, err = proc.communicate(timeout=60)
    assert runner.wait_gone(pids) == []
    if signum == signal.SIGINT:
        assert proc.returncode == 130, err
        assert b"got SIGINT: stopping the workers on every host" in err


def test_an_unreachable_or_unknown_host_is_refused_before_any_worker_starts(
        runner: Runner, ssh_testbed: list[str], tmp_path: Path) -> None:
    script = runner.script("hold.py", HOLD)
    folder = tmp_path / "pids"
    folder.mkdir()
    result = runner.run(["--hosts", "node1:1,127.0.1.9:1,no-such-host.invalid:1",
                         *ssh_testbed, str(script), str(folder)], timeout=60)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert any(line.startswith("unirank run: error: host 127.0.1.9: ssh cannot reach it")
               and "Connection refused" in line for line in lines), result.stderr
    assert any(line.startswith("unirank run: error: host no-such-host.invalid: ssh cannot "
                               "reach it") for line in lines), result.stderr
    assert not any("node1" in line for line in lines)
    assert list(folder.iterdir()) == []  # no worker started


def test_the_carried_variables_and_x_names_reach_every_host_and_no_other_nor_ps(
        runner: Runner, ssh_testbed: list[str]) -> None:
    script = runner.script("env.py", """
import glob, json, os
names = ["NCCL_UNIRANK_TEST", "MY_EXPORTED", "MY_API_TOKEN", "UNRELATED_VAR"]
print("ENV " + json.dumps([os.environ["RANK"], {n: os.environ.get(n) for n in names}]))
shown = []  # command lines of this machine's processes (both hosts, the ssh clients) with it
for path in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        with open(path, "rb") as f:
            if b"s3cret" in f.read():
                shown.append(path)
    except OSError:
        pass
print("SHOWN " + json.dumps(shown))
""")
    env = {"NCCL_UNIRANK_TEST": "nccl 1", "MY_EXPORTED": "it's here", "MY_API_TOKEN": "s3cret",
           "UNRELATED_VAR": "stays"}
    result = runner.run([*HOSTS, *ssh_testbed, "-x", "MY_EXPORTED", "-xMY_API_TOKEN",
                         str(script)], env=env)
    assert result.returncode == 0, result.stderr
    seen = dict(json.loads(line[4:]) for line in result.stdout.splitlines()
                if line.startswith("ENV "))
    expected = {"NCCL_UNIRANK_TEST": "nccl 1", "MY_EXPORTED": "it's here",
                "MY_API_TOKEN": "s3cret", "UNRELATED_VAR": None}
    assert seen == {str(rank): expected for rank in range(4)}
    assert [line for line in result.stdout.splitlines() if line.startswith("SHOWN ")] == \
        ["SHOWN []"] * 4  # the -x secret is in no process's command line (it went over stdin)


def _doctor(runner: Runner, hosts: str, ssh_options: list[str]) -> subprocess.CompletedProcess[str]:
    """``unirank doctor --hosts HOSTS`` with the testbed's ssh options."""
    return subprocess.run([sys.executable, "-m", "unirank", "doctor", "--hosts", hosts,
                           *ssh_options], cwd=runner.cwd, text=True, capture_output=True,
                          timeout=120, env=runner.environ(), check=False)


def test_doctor_checks_every_host_then_a_group_across_them(
        runner: Runner, ssh_testbed: list[str]) -> None:
    result = _doctor(runner, "node1,node2", ssh_testbed)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^ssh node1 +OK +python .*torch", result.stdout, re.MULTILINE)
    assert re.search(r"^ssh node2 +OK", result.stdout, re.MULTILINE)
    assert re.search(r"^group +OK +2 ranks on 2 nodes \(node1, node2\)", result.stdout,
                     re.MULTILINE), result.stdout


def test_doctor_names_an_unreachable_host_and_starts_nothing(
        runner: Runner, ssh_testbed: list[str]) -> None:
    result = _doctor(runner, "node1,127.0.1.9", ssh_testbed)
    assert result.returncode == 1
    assert re.search(r"^ssh 127.0.1.9 +FAIL +ssh cannot reach it", result.stdout, re.MULTILINE)
    assert "group" not in result.stdout


def test_the_root_cause_is_the_host_that_failed_not_the_one_that_lost_a_peer_first(
        runner: Runner, ssh_testbed: list[str], tmp_path: Path) -> None:
    """Rank 3 (node2) exits 3; ranks 0 and 1 (node1) then fail at once as a rank whose peer
    went away fails (gloo's "Connection closed by peer"), so node1's unirank run ends first,
    with 1; rank 2 (node2) ignores SIGTERM, so node2's ends only after its grace period. The
    launcher still names node2, with exit code 3."""
    script = runner.script("train.py", """
import os, signal, sys, threading, time
rank = int(os.environ["RANK"])
flag = os.path.join(sys.argv[1], "rank3.exited")
if rank == 3:
    open(flag, "w").close()
    sys.exit(3)
if rank == 2:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Event().wait(60)
while not os.path.exists(flag):
    time.sleep(0.05)  # polls rank 3's flag: a condition, with the test's timeout
raise RuntimeError("[pair.cc:553] Connection closed by peer [127.0.1.2]:1234")
""")
    folder = tmp_path / "flags"
    folder.mkdir()
    result = runner.run([*HOSTS, *ssh_testbed, "--grace-period", "3", str(script),
                         str(folder)])
    assert result.returncode == 3, result.stderr
    assert result.stderr.index("FAILED (exit code 1): rank ") < \
        result.stderr.index("FAILED (exit code 3): rank 3")  # node1 did end first
    assert result.stderr.splitlines()[-1] == ("unirank run: host node2 (node rank 1) ended the "
                                              "job: unirank run failed with exit code 3")
    assert "UNIRANK-HOST-VERDICT" not in result.stderr


#: steps of an all-reduce; at step 1 of the first attempt each rank writes "rank:pid" to the
#: FIFO argv[2] (the test holds it open for reading from the start)
ELASTIC = """
import os, sys, time
import torch
import torch.distributed as dist

steps, fifo = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
for step in range(steps):
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"step {step} rank {rank} world {world} restart {restart}", flush=True)
    if step == 1 and restart == "0":
        with open(fifo, "w") as out:
            out.write(f"{rank}:{os.getpid()}\\n")
    time.sleep(0.1)
dist.destroy_process_group()
"""


def _ancestor(pid: int, mark: str) -> int:
    """The nearest process above ``pid`` whose command line holds ``mark``."""
    while pid > 1:
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        if mark in Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " "):
            return pid
    raise AssertionError(f"no process above holds {mark!r}")


@pytest.mark.parametrize("lost", ["node2", "node1"])
def test_an_elastic_host_list_survives_a_lost_host(runner: Runner, ssh_testbed: list[str],
                                                   tmp_path: Path, lost: str) -> None:
    """``--hosts node1:1,node2:1 --nnodes 1:2 --max-restarts 3``: each host is a node of the
    dynamic rendezvous (endpoint on node1, node rank 0). One host's whole remote tree (its
    unirank run, the rendezvous helper, the worker) is SIGKILLed while both train: the
    launcher names the lost host and goes on, the other restarts alone at a world of 1,
    finishes, and the job ends 0; node1 lost, the rendezvous moves to node2."""
    import os
    import select

    script = runner.script("elastic.py", ELASTIC)
    fifo = tmp_path / "ready.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    keep = os.open(fifo, os.O_WRONLY)
    proc = runner.start(["--hosts", "node1:1,node2:1", "--nnodes", "1:2", "--max-restarts",
                         "3", *ssh_testbed, str(script), "60", str(fifo)], text=True)
    text = ""
    try:
        while text.count("\n") < 2:
            ready, _, _ = select.select([reader], [], [], 120)
            assert ready, f"the ranks did not report within 120 s: {text!r}"
            text += os.read(reader, 4096).decode()
    finally:
        os.close(reader)
        os.close(keep)
    pids = dict(line.split(":") for line in text.split())
    for pid in process_tree(_ancestor(int(pids["1" if lost == "node2" else "0"]),
                                      "--from-ssh")):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert f"unirank run: host {lost} is lost: its unirank run ended with exit code " in err, err
    assert lost == "node2" or "unirank run: store moved to node node2" in err, err
    assert "rendezvous round 1: node rank 0 of 1, 1 worker in all" in err, err
    assert "step 59 rank 0 world 1 restart 1" in out.splitlines(), out


SECRET_SEEN = """
import hashlib, os
import torch.distributed as dist
dist.init_process_group("gloo")
held = os.environ.get("UNIRANK_RDZV_SECRET", "")
print(f"rank {dist.get_rank()} secret {hashlib.sha256(held.encode()).hexdigest()[:16]}",
      flush=True)
dist.destroy_process_group()
"""


def test_an_elastic_host_list_makes_one_secret_that_reaches_every_host(
        runner: Runner, ssh_testbed: list[str]) -> None:
    """``--hosts`` with ``--nnodes 1:2`` and no secret given: the launcher makes the job's
    rendezvous secret and each host's unirank run gets it (over ssh's stdin, not a command
    line): both hosts' ranks see the same one, and it is not the empty one."""
    import hashlib

    script = runner.script("secret_seen.py", SECRET_SEEN)
    result = runner.run(["--hosts", "node1:1,node2:1", "--nnodes", "1:2", *ssh_testbed,
                         str(script)], drop=("UNIRANK_RDZV_SECRET", "UNIRANK_RDZV_SECRET_FILE"))
    assert result.returncode == 0, result.stderr
    seen = dict(re.findall(r"rank (\d) secret (\w+)", result.stdout))
    assert sorted(seen) == ["0", "1"], result.stdout
    assert seen["0"] == seen["1"] != hashlib.sha256(b"").hexdigest()[:16], result.stdout
