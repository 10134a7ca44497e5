"""The job files ``unirank stacks`` finds a running job by: written, found by run id or Slurm
job id, withdrawn; a file whose process is gone is removed when looked for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from unirank.hang import jobs


@pytest.fixture(autouse=True)
def own_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def test_announce_find_withdraw() -> None:
    path = jobs.announce({"run_id": "123.0", "master_addr": "node1", "master_port": 29500})
    assert path is not None and path.endswith("/123.0.json")
    [found] = jobs.find_jobs("123")  # a Slurm job id finds its step
    assert (found["master_port"], found["pid"]) == (29500, os.getpid())
    assert jobs.find_jobs("12") == [] and jobs.find_jobs("123.0") == [found]
    jobs.withdraw(path)
    assert jobs.find_jobs() == [] and not os.path.exists(path)


def test_a_stale_file_is_removed() -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    os.makedirs(jobs.jobs_dir(), exist_ok=True)
    stale = Path(jobs.jobs_dir()) / "old.json"
    stale.write_text(json.dumps({"run_id": "old", "pid": int(gone.stdout)}))
    assert jobs.find_jobs() == [] and not stale.exists()
