"""The rule of what is swept from the temporary folder (pure: :func:`unirank.own.should_sweep`,
:func:`unirank.owner.owner_state`), and the sweep on real folders and this process's identity.

The real runs (a SIGKILLed ``unirank run``, a c10d run, a container's job file) are in
tests/integration/test_leftovers.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from unirank import owner as own
from unirank import sweep
from unirank.owner import ALIVE, DEAD, NO_START, UNKNOWN, Here, Owner, owner_state

DAY = 86400.0
HERE = Here(pidns="pid:[1]", boot="b1", host="node1")
ME = Owner(pid=42, start=1000, pidns="pid:[1]", boot="b1", host="node1")


@pytest.mark.parametrize(("state", "report", "age", "swept"), [
    (DEAD, False, 0.0, True),            # owner gone, nothing to read: at once
    (DEAD, True, 6 * DAY, False),        # something to read: kept for KEEP_DAYS
    (DEAD, True, 7 * DAY, True),
    (ALIVE, False, 30 * DAY, False),     # a run of a month keeps its folder
    (UNKNOWN, False, 30 * DAY, False),   # another namespace's: never ours to remove
    (None, False, 0.0, False),           # no owner record (being made, or older unirank)
    (None, False, 7 * DAY, True),
])
def test_should_sweep(state: str | None, report: bool, age: float, swept: bool) -> None:
    assert own.should_sweep(state, report, age) is swept  # type: ignore[arg-type]


@pytest.mark.parametrize(("owner", "seen", "state"), [
    (ME, 1000, ALIVE),
    (ME, None, DEAD),                              # no process has the pid
    (ME, 2000, DEAD),                              # the pid was given to a later process
    (ME, NO_START, UNKNOWN),                       # runs, start time unreadable
    (Owner(42, 1000, "pid:[9]", "b1", "node1"), 1000, UNKNOWN),   # another PID namespace
    (Owner(1, 1000, "pid:[9]", "b1", "node1"), None, UNKNOWN),    # a container's PID 1
    (Owner(42, 1000, "pid:[9]", "b0", "node1"), 1000, DEAD),      # booted since
    (Owner(42, 1000, "pid:[1]", "b0", "node2"), None, UNKNOWN),   # another machine's
    # this kernel's container with a host name of its own (a pod's UTS namespace)
    (Owner(42, 1000, "pid:[1]", "b1", "pod-1"), None, DEAD),
    (Owner(42, 1000, "pid:[1]", "b1", "pod-1"), 1000, ALIVE),
    (Owner(42), 7, UNKNOWN),                       # an older unirank's record: pid only
    (Owner(42), None, DEAD),
])
def test_owner_state(owner: Owner, seen: int | None, state: str) -> None:
    assert owner_state(owner, HERE, seen) == state


def test_no_proc_is_checked_by_pid_alone() -> None:
    bare = Here("", "", "node1")
    assert owner_state(ME, bare, 5) == UNKNOWN and owner_state(ME, bare, None) == DEAD


def test_records_round_trip_and_bad_ones_name_no_owner() -> None:
    assert Owner.from_record(ME.to_record()) == ME
    assert Owner.from_record({"pid": 7}) == Owner(7)
    for bad in ({}, {"pid": 0}, {"pid": "x"}, {"pid": 3, "start": None}):
        assert Owner.from_record(bad) is None


def test_this_process_is_alive_and_an_ended_one_is_dead() -> None:
    mine = own.owner_of().to_record()
    assert own.state_of_record(mine) == ALIVE
    ended = subprocess.run([sys.executable, "-c", "from unirank.owner import owner_of; import json;"
                            " print(json.dumps(owner_of().to_record()))"],
                           capture_output=True, text=True, check=True)
    assert own.state_of_record(json.loads(ended.stdout)) == DEAD
    assert own.state_of_record({**mine, "start": mine["start"] + 1}) == DEAD  # pid reused


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _owned(tmp: Path, name: str, record: dict[str, object] | None) -> Path:
    folder = tmp / name
    (folder / "attempt_0" / "0").mkdir(parents=True)
    if record is not None:
        (folder / sweep.OWNER_FILE).write_text(json.dumps(record))
    return folder


def test_sweep_removes_only_what_the_rule_gives_up(tmp: Path) -> None:
    mine = own.owner_of().to_record()
    gone = {**mine, "start": mine["start"] + 1}
    other_ns = {**mine, "pidns": "pid:[1]", "pid": 1}
    dead = _owned(tmp, "unirank-run-dead", gone)
    report = _owned(tmp, "unirank-run-report", gone)
    (report / "attempt_0" / "hang").mkdir()
    (report / "attempt_0" / "hang" / "report-1.txt").write_text("rank 1 never entered")
    rdzv_empty = _owned(tmp, "unirank-rdzv-a", gone)
    (rdzv_empty / "helper.log").write_text("")
    snapshots = _owned(tmp, "unirank-state-dead", gone)  # its files are never a report
    (snapshots / "step-3").mkdir()
    (snapshots / "step-3" / "__0_0.distcp").write_bytes(b"state")
    kept = [report, _owned(tmp, "unirank-run-live", mine),
            _owned(tmp, "unirank-state-live", mine),
            _owned(tmp, "unirank-run-container", other_ns),
            _owned(tmp, "unirank-run-noowner", None), _owned(tmp, "not-unirank-run", gone)]
    assert sorted(sweep.sweep(shm=str(tmp))) == sorted([str(dead), str(rdzv_empty),
                                                        str(snapshots)])
    assert [p.exists() for p in kept] == [True] * len(kept)
    old = tmp.stat().st_mtime - 8 * DAY
    for folder in (report, tmp / "unirank-run-noowner"):
        os.utime(folder, (old, old))
    assert sorted(sweep.sweep(shm=str(tmp))) == sorted(str(p) for p in kept[:1] + kept[4:5])


def test_an_owned_folder_names_its_maker(tmp: Path) -> None:
    path = sweep.make_owned_folder(sweep.RUN_PREFIX)
    assert os.path.basename(path).startswith("unirank-run-")
    assert sweep.read_owner(path) == own.owner_of().to_record()
    assert sweep.sweep(shm=str(tmp)) == [] and os.path.isdir(path)


def test_the_sessions_check_names_what_a_sweep_leaves(tmp: Path) -> None:
    """tests/_tmpcheck.py: what the sweep removes is counted, a dead run's folder with a report
    is kept, a live owner's entry is a leftover."""
    from _tmpcheck import leftovers

    mine = own.owner_of().to_record()
    gone = {**mine, "start": mine["start"] + 1}
    _owned(tmp, "unirank-run-dead", gone)
    report = _owned(tmp, "unirank-run-report", gone)
    (report / "attempt_0" / "0" / "error.json").write_text("{}")
    _owned(tmp, "unirank-run-leaked", mine)
    assert leftovers(tmp) == (1, ["unirank-run-report"], ["unirank-run-leaked"])


def test_a_zombie_owner_is_dead() -> None:
    """A process that ended and that its parent has not reaped yet runs no more."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        started = own.seen_start(child.pid)
        assert started is not None and started >= 0
        assert child.stdin is not None
        child.stdin.close()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped
        assert own.seen_start(child.pid) is None
    finally:
        child.wait()


def test_a_run_folder_s_spares_count_is_no_report(tmp_path: Path) -> None:
    """A killed elastic run leaves the count of spares it kept (a non-empty file): that is the
    run's bookkeeping, not something to read, so the folder is swept as an empty one (27
    folders of killed runs were kept three days for it in one test run)."""
    from unirank.runfolder import RunFolder, write_evicted
    from unirank.sweep import _holds_report

    folder = tmp_path / "unirank-run-x"
    (folder / "attempt_0").mkdir(parents=True)
    Path(RunFolder(str(folder)).spares_file).write_text("1\n")
    assert not _holds_report(str(folder))
    write_evicted(RunFolder(str(folder)).evicted_file, 0, [1], "node evicted: rank 1 ...")
    assert not _holds_report(str(folder))  # nor is its record of the last eviction
    (folder / "attempt_0" / "error.json").write_text("{}")
    assert _holds_report(str(folder))
