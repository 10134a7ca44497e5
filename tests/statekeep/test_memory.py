"""The node's snapshot memory: where it is made, and the copy of its newest whole step to the
program's disk folder as a run ends (files in a test folder; no torch)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from unirank.statekeep.memory import (
    DISK_NOTE,
    SHM,
    flush_to_disk,
    make_memory_folder,
    memory_root,
    note_disk_folder,
    remove_memory_folder,
)
from unirank.statekeep.rules import METADATA, WHOLE
from unirank.sweep import OWNER_FILE, STATE_PREFIX


def test_the_memory_is_dev_shm_unless_a_folder_is_named(tmp_path: Path) -> None:
    assert memory_root({}) == SHM  # this machine has a /dev/shm this user can write
    assert memory_root({"UNIRANK_STATE_SHM": str(tmp_path)}) == str(tmp_path)


def test_a_run_s_memory_is_an_owned_folder_removed_at_its_end(tmp_path: Path) -> None:
    made = make_memory_folder({"UNIRANK_STATE_SHM": str(tmp_path)})
    assert made is not None
    assert os.path.basename(made).startswith(STATE_PREFIX)
    assert (Path(made) / OWNER_FILE).exists()
    remove_memory_folder(made)
    assert not os.path.exists(made)
    assert make_memory_folder({"UNIRANK_STATE_SHM": str(tmp_path / "none")}) is None


def _step(memory: Path, step: int, files: dict[str, bytes], whole: bool) -> None:
    folder = memory / f"step-{step}"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    if whole:
        (folder / WHOLE).write_text(json.dumps(sorted(files)))


def test_the_newest_whole_step_goes_to_disk_where_the_disk_lacks_it(tmp_path: Path) -> None:
    memory, disk = tmp_path / "memory", tmp_path / "disk"
    memory.mkdir()
    files = {"__0_0.distcp": b"zero", "__1_0.distcp": b"one", METADATA: b"meta"}
    _step(memory, 4, files, whole=True)
    _step(memory, 5, {"__0_0.distcp": b"torn"}, whole=False)  # its copies never came
    assert flush_to_disk(str(memory)) is None  # no folder named: nothing to do
    note_disk_folder(str(memory), str(disk))
    assert (memory / DISK_NOTE).read_text() == str(disk)
    assert flush_to_disk(str(memory)) == f"the state of step 4 kept in {disk} (from this " \
        "node's memory)"
    assert {p.name: p.read_bytes() for p in (disk / "step-4").iterdir()} == files
    assert flush_to_disk(str(memory)) is None  # the disk holds it now


def test_a_disk_step_as_new_is_left_alone(tmp_path: Path) -> None:
    memory, disk = tmp_path / "memory", tmp_path / "disk"
    memory.mkdir()
    _step(memory, 4, {METADATA: b"meta"}, whole=True)
    (disk / "step-6").mkdir(parents=True)
    (disk / "step-6" / METADATA).write_bytes(b"newer")
    note_disk_folder(str(memory), str(disk))
    assert flush_to_disk(str(memory)) is None
    assert sorted(p.name for p in disk.iterdir()) == ["step-6"]
