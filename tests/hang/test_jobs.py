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

from unirank import owner
from unirank.hang import jobs


@pytest.fixture(autouse=True)
def own_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def test_announce_find_withdraw() -> None:
    path = jobs.announce({"run_id": "123.0", "master_addr": "node1", "master_port": 29500})
    assert path is not None and path.endswith(f"/123.0.{os.getpid()}.json")
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


def test_a_job_announced_twice_on_a_node_is_found_once_and_outlives_its_first_writer() -> None:
    """With --virtual-local-rank every worker of a node is its first local rank and writes a
    job file: the first to end must not hide the job from ``unirank stacks``."""
    job = {"run_id": "77", "master_addr": "node1", "master_port": 29500}
    script = ("import sys, time; from unirank.hang import jobs; "
              f"jobs.announce({job!r}); print('ready', flush=True); sys.stdin.read()")
    other = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "TMPDIR": tempfile.gettempdir()})
    try:
        assert other.stdout is not None and other.stdout.readline() == "ready\n"
        mine = jobs.announce(job)
        assert [found["run_id"] for found in jobs.find_jobs()] == ["77"]
        jobs.withdraw(mine)
        [left] = jobs.find_jobs("77")
        assert left["pid"] == other.pid
    finally:
        assert other.stdin is not None
        other.stdin.close()
        other.wait(timeout=30)
    assert jobs.find_jobs() == []


def _write(name: str, record: dict[str, object]) -> Path:
    os.makedirs(jobs.jobs_dir(), exist_ok=True)
    path = Path(jobs.jobs_dir()) / name
    path.write_text(json.dumps(record))
    return path


def test_a_reused_pid_is_no_running_job_and_its_file_goes() -> None:
    """The pid runs (this process), but started at another time: the writer is gone."""
    mine = owner.owner_of().to_record()
    stale = _write("old.1.json", {"run_id": "old", **mine, "start": mine["start"] + 1})
    assert jobs.scan_jobs() == ([], []) and not stale.exists()


def test_a_file_of_another_pid_namespace_is_unchecked_not_running_and_kept() -> None:
    """A container's PID 1 wrote it: pid 1 runs here too (init), and means another process."""
    mine = owner.owner_of().to_record()
    boxed = _write("box.1.json", {"run_id": "box", **mine, "pid": 1, "pidns": "pid:[1]"})
    path = jobs.announce({"run_id": "live", "master_addr": "node1", "master_port": 29500})
    live, unchecked = jobs.scan_jobs()
    assert [j["run_id"] for j in live] == ["live"] and [j["run_id"] for j in unchecked] == ["box"]
    assert jobs.scan_jobs("box") == ([], unchecked)
    jobs.withdraw(path)
    assert jobs.sweep_jobs() == [] and boxed.exists()


def test_the_sweep_removes_dead_files_and_the_empty_folder() -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = _write("old.json", {"run_id": "old", "pid": int(gone.stdout)})
    assert jobs.sweep_jobs() == [str(stale), jobs.jobs_dir()]
    assert not os.path.exists(jobs.jobs_dir())


def test_a_job_file_names_its_supervisor_which_tells_a_restart_from_an_end() -> None:
    """``unirank top`` waits for a next attempt only while the process that runs the attempts
    (the job's ``supervisor_pid``, else the parent) runs: a gone one means the job ended."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        path = jobs.announce({"run_id": "r1", "master_addr": "a", "master_port": 1,
                              "supervisor_pid": child.pid})
        assert path is not None
        [record] = jobs.find_jobs("r1")
        assert record["supervisor"]["pid"] == child.pid and "supervisor_pid" not in record
        assert not jobs.supervisor_gone(record)
    finally:
        child.communicate(b"")
    assert jobs.supervisor_gone(record)
    parent = jobs.announce({"run_id": "r2", "master_addr": "a", "master_port": 1})
    assert parent is not None
    [record] = jobs.find_jobs("r2")
    assert record["supervisor"]["pid"] == os.getppid() and not jobs.supervisor_gone(record)
    assert not jobs.supervisor_gone({"run_id": "old"})  # an older file: not known, not gone


def test_a_file_its_writer_never_finished_goes_once_the_writer_is_gone() -> None:
    """A writer killed between opening its ``.json.tmp`` and renaming it leaves the file (a CI
    run once kept the folder for this, an empty ``.tmp``): swept as a dead owner's, so that
    the folder can go; a running writer's stays (its rename comes next)."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = _write(f"r.{int(gone.stdout)}.json.tmp", {})
    dead.write_text("")
    running = _write(f"r.{os.getpid()}.json.tmp", {})
    assert jobs.sweep_jobs() == [str(dead)] and running.exists()
    running.unlink()
    assert jobs.sweep_jobs() == [jobs.jobs_dir()]


def test_a_file_that_holds_no_record_is_no_job_and_kept_until_old() -> None:
    """A ``.json`` file that is not a JSON object names no owner: not a job, not removed young."""
    broken = Path(jobs.jobs_dir()) / "broken.1.json"
    os.makedirs(broken.parent, exist_ok=True)
    broken.write_text("{not json")
    assert jobs.scan_jobs() == ([], []) and jobs.sweep_jobs() == [] and broken.exists()
    old = 8 * 86400
    os.utime(broken, (broken.stat().st_atime - old, broken.stat().st_mtime - old))
    assert jobs.sweep_jobs() == [str(broken), jobs.jobs_dir()]
