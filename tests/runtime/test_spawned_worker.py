"""A worker that unirank started, seen from the user: one line for a launch or usage mistake in
``Parallel``'s spawn mode, tracebacks kept for real exceptions, and one join per rank per run.

Every process is real (``python examples/train.py``, ``unirank run``, ``torchrun``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _procs import Runner, launcher_free_environ

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), env=launcher_free_environ(), capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL, cwd=ROOT)


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@pytest.mark.parametrize(("args", "expected"), [
    (["--backend", "foo"], "train.py: error: backend='foo': is not a torch.distributed backend"),
    (["--backend", "nccl"], "train.py: error: backend='nccl': the nccl backend needs CUDA"),
])
def test_a_config_error_in_spawned_workers_is_one_line(args: list[str], expected: str) -> None:
    """The README's first way to run the example, with a mistake: its one line, exit 1."""
    if "nccl" in args and _cuda():
        pytest.skip("nccl works here: the mistake needs a machine without CUDA")
    proc = _run(sys.executable, "examples/train.py", *args, "--nproc_per_node", "2")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines()
             if "ignite.distributed.launcher.Parallel" not in line
             and not line.startswith("\t")]  # ignite's log lines
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(expected), proc.stderr


def test_a_real_exception_keeps_its_traceback() -> None:
    proc = _run(sys.executable, str(SCRIPTS / "parallel_raises.py"))
    assert proc.returncode != 0
    assert "Traceback (most recent call last)" in proc.stderr
    assert 'raise ValueError("bad value on rank 1")' in proc.stderr  # the worker's own frame
    assert "WorkerFailedError: local rank 1 (rank 1) exited with code 1: ValueError: bad " \
           "value on rank 1" in proc.stderr


def _results(proc: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
    assert proc.returncode == 0, proc.stderr
    # torchrun's workers share its stdout: an unbuffered rank's line can be glued to another's
    rows = [json.loads(found) for found in re.findall(r"RESULT (\{[^{}]*\})", proc.stdout)]
    return sorted(rows, key=lambda row: int(str(row["rank"])))


def test_a_rank_joins_once_under_unirank_run() -> None:
    """The bootstrap's join check stands for the first ``ur.init()``; a second init joins."""
    rows = _results(_run(*Runner.command(["-n", "2", str(SCRIPTS / "join_once.py")])))
    assert rows == [{"rank": r, "bootstrap": 2, "first_init_joined": False,
                     "second_init_joined": True} for r in (0, 1)]


def test_init_joins_where_no_bootstrap_did() -> None:
    """Under torchrun no bootstrap joined: ``ur.init()`` runs the join check itself."""
    torchrun = shutil.which("torchrun")
    assert torchrun, "torchrun comes with torch"
    rows = _results(_run(torchrun, "--standalone", "--nproc_per_node", "2",
                         str(SCRIPTS / "join_once.py")))
    assert rows == [{"rank": r, "bootstrap": 0, "first_init_joined": True,
                     "second_init_joined": True} for r in (0, 1)]
