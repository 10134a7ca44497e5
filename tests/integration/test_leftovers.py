"""Nothing of a run stays in the temporary folder (the rule: :mod:`unirank.sweep`): real
``unirank run`` processes, each with a temporary folder of the test's own (TMPDIR).

- a run that ends (normally, failed after a restart, on SIGTERM or SIGINT) removes what it
  made;
- a c10d run leaves no rendezvous log;
- a run whose launcher is SIGKILLed leaves its folder and job file, and the next run sweeps
  them;
- job files written in another PID namespace (a container's PID 1: ``unshare --pid --fork
  --mount-proc``, as root) are not taken as running jobs by ``unirank stacks``, nor swept.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from _procs import Runner, process_tree, unavailable

WAITS = """\
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
print("READY", os.environ["RANK"], flush=True)
if os.environ.get("FAIL") and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    sys.exit(3)
if os.environ.get("WAIT"):
    time.sleep(600)
dist.barrier()
dist.destroy_process_group()
"""


def _entries(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir())


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    folder = tmp_path / "tmp"
    folder.mkdir()
    return folder


def test_runs_that_end_leave_nothing(runner: Runner, tmp: Path) -> None:
    """A plain run, a c10d run, and a run that fails once and is restarted: nothing left (a
    c10d run left an empty rendezvous log, every run with the hang detector its job files'
    folder)."""
    script = runner.script("w.py", WAITS)
    env = {"TMPDIR": str(tmp)}
    for args, extra in ((["--nproc-per-node", "2"], {}),
                        (["--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                          "--rdzv-endpoint", "127.0.0.1:0"], {}),
                        (["--nproc-per-node", "2", "--max-restarts", "1"], {"FAIL": "1"})):
        result = runner.run([*args, str(script)], env={**env, **extra})
        assert result.returncode == 0, result.stderr
        assert _entries(tmp) == [], (args, result.stderr)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_run_stopped_by_a_signal_leaves_nothing(runner: Runner, tmp: Path,
                                                  signum: signal.Signals) -> None:
    """SIGTERM (scancel's first signal, a container's stop) and Ctrl-C's SIGINT."""
    script = runner.script("w.py", WAITS)
    proc = runner.start(["--nproc-per-node", "2", str(script)],
                        env={"TMPDIR": str(tmp), "WAIT": "1"})
    assert proc.stdout is not None
    runner.read_lines(proc.stdout, 2, contains="READY")
    proc.send_signal(signum)
    proc.communicate(timeout=60)
    assert _entries(tmp) == []


def test_a_sigkilled_run_is_swept_by_the_next(runner: Runner, tmp: Path) -> None:
    script = runner.script("w.py", WAITS)
    env = {"TMPDIR": str(tmp)}
    proc = runner.start(["--nproc-per-node", "2", str(script)], env={**env, "WAIT": "1"})
    assert proc.stdout is not None
    runner.read_lines(proc.stdout, 2, contains="READY")
    tree = process_tree(proc.pid)
    proc.kill()
    proc.communicate(timeout=60)
    assert runner.wait_gone(tree, mark=b"") == []
    [folder] = tmp.glob("unirank-run-*")
    assert json.loads((folder / "owner.json").read_text())["pid"] == proc.pid
    assert [p.name for p in tmp.glob(f"unirank-{os.getuid()}/*.json")] != []  # rank 0's
    result = runner.run(["--nproc-per-node", "1", str(script)], env=env)
    assert result.returncode == 0, result.stderr
    assert _entries(tmp) == []


CONTAINER = """\
import sys
from unirank.hang import jobs
path = jobs.announce({"run_id": sys.argv[1], "master_addr": "127.0.0.1", "master_port": 9,
                      "world_size": 1, "interval": 1.0})
print(path, flush=True)
sys.stdin.read()
jobs.withdraw(path)
"""


def _in_container(tmp: Path, run_id: str) -> subprocess.Popen[str]:
    """A process that is PID 1 of a PID namespace of its own, which writes a job file."""
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable,
                             "-c", CONTAINER, run_id], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def test_job_files_of_containers_are_no_running_jobs_here(tmp: Path) -> None:
    """Two containers' PID 1 each wrote a job file with pid 1 (this namespace's init runs):
    ``unirank stacks`` does not say that several jobs run, and the sweep keeps them."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        unavailable("needs root and unshare to make a PID namespace")
    boxes = [_in_container(tmp, run_id) for run_id in ("box-a", "box-b")]
    try:
        for box in boxes:
            assert box.stdout is not None
            assert box.stdout.readline().strip().endswith(".1.json")
        env = {**os.environ, "TMPDIR": str(tmp)}
        stacks = subprocess.run([sys.executable, "-m", "unirank", "stacks"], env=env,
                                capture_output=True, text=True, timeout=60)
        assert stacks.returncode == 2, stacks.stderr
        assert "several" not in stacks.stderr
        assert "another PID namespace" in stacks.stderr and "box-a, box-b" in stacks.stderr
        named = subprocess.run([sys.executable, "-m", "unirank", "stacks", "--job", "box-a",
                                "--timeout", "1"], env=env, capture_output=True, text=True,
                               timeout=60)
        assert named.returncode == 1 and "several" not in named.stderr, named.stderr
        sweep = subprocess.run([sys.executable, "-c", "from unirank.sweep import sweep; "
                                "print(sweep())"], env=env, capture_output=True, text=True,
                               timeout=60, check=True)
        assert sweep.stdout.strip() == "[]"
    finally:
        for box in boxes:
            box.communicate("", timeout=30)
    assert len(list(tmp.glob("unirank-*/*.json"))) == 0  # each withdrew its own
