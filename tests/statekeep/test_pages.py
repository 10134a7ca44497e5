"""A node's memory writes a new step over the pages of the step it dropped, and sums each file
as it writes it (:mod:`unirank.runtime.snapshotpages`): the old bytes never under a step's
name, nothing of the old file left past the new end, the sum the file's own."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from unirank.runtime.snapshotcopies import crc_of, node_step
from unirank.runtime.snapshotpages import give_back, take_pages
from unirank.runtime.snapshotread import MemoryWriter, SummedFiles
from unirank.statekeep.rules import METADATA, PAGES, WHOLE


def _step(tier: Path, name: str, files: dict[str, bytes]) -> Path:
    folder = tier / name
    folder.mkdir()
    for file, data in files.items():
        (folder / file).write_bytes(data)
    return folder


def test_a_dropped_step_s_files_wait_nameless_and_its_metadata_goes(tmp_path: Path) -> None:
    old = _step(tmp_path, "step-3", {"__0_0.distcp": b"x" * 100, METADATA: b"m", WHOLE: b"[]"})
    earlier = _step(tmp_path, PAGES, {"__9_0.distcp": b"y" * 10})
    give_back(str(tmp_path), str(old))
    assert not old.exists()
    assert sorted(p.name for p in earlier.iterdir()) == ["__0_0.distcp"]  # the earlier freed
    assert sorted(p.name for p in tmp_path.iterdir()) == [PAGES]  # no step left to count


def test_a_new_file_is_written_over_a_waiting_one_and_cut_to_its_own_length(
        tmp_path: Path) -> None:
    _step(tmp_path, PAGES, {"__0_0.distcp": b"o" * 4096 * 3})
    waiting = os.stat(tmp_path / PAGES / "__0_0.distcp").st_ino
    folder = _step(tmp_path, "step-4", {})
    files = SummedFiles(str(tmp_path))
    with files.create_stream(str(folder / "__0_0.distcp"), "wb") as stream:
        stream.write(b"new" * 10)
        stream.write(memoryview(b"!" * 5))
        stream.close()  # as DCP's writer does, before the stream is given back
    written = folder / "__0_0.distcp"
    assert written.read_bytes() == b"new" * 10 + b"!" * 5
    assert os.stat(written).st_ino == waiting  # its pages, not new ones
    assert not (tmp_path / PAGES / "__0_0.distcp").exists()
    assert files.sums == {"__0_0.distcp": crc_of(str(written))}


def test_with_nothing_waiting_a_file_is_written_new(tmp_path: Path) -> None:
    folder = _step(tmp_path, "step-0", {})
    files = SummedFiles(str(tmp_path))
    with files.create_stream(str(folder / "__1_0.distcp"), "wb") as stream:
        stream.write(b"abc")
    assert (folder / "__1_0.distcp").read_bytes() == b"abc"
    assert files.sums["__1_0.distcp"] == crc_of(str(folder / "__1_0.distcp"))
    assert not take_pages(str(tmp_path), str(folder / "__2_0.distcp"))


def test_dcp_s_memory_writer_sums_what_torch_save_wrote(tmp_path: Path) -> None:
    """The sums of the files a real DCP save wrote are their CRC-32s read back (torch.save
    writes each file front to back through the stream), also over a waiting file."""
    from torch.distributed.checkpoint.state_dict_saver import save

    for step, size in ((0, 1000), (1, 10)):
        folder = tmp_path / f"step-{step}"
        writer = MemoryWriter(str(folder))
        save({"w": torch.arange(size, dtype=torch.float32), "n": step},
             storage_writer=writer, no_dist=True)
        assert writer.sums and set(writer.sums) == set(writer.written)
        for name, crc in writer.sums.items():
            assert crc == crc_of(str(folder / name)), name
        held = node_step(str(folder))
        assert held.needed is not None and held.needed <= set(held.held)
        if step == 0:
            give_back(str(tmp_path), str(folder))
    assert not any((tmp_path / PAGES).iterdir())  # the new step took the old one's pages


def test_the_waiting_pages_count_as_room_for_the_next_step(tmp_path: Path) -> None:
    from unirank.runtime.snapshotpages import waiting_bytes

    assert waiting_bytes(str(tmp_path)) == 0
    give_back(str(tmp_path), str(_step(tmp_path, "step-1", {"__0_0.distcp": b"z" * 300,
                                                            "__1_0.distcp": b"z" * 200})))
    assert waiting_bytes(str(tmp_path)) == 500


def test_the_runtime_s_snapshot_modules_import_no_checkpoint_module() -> None:
    """torch.distributed.checkpoint comes only with a first save or load: imported by the
    modules a program that never saves still imports (``ur.finalize`` and the collectives
    import the snapshot calls), it made its interpreter abort at exit ("terminate called
    without an active exception": 4 of 30 torchrun runs of tests/runtime/scripts/
    user_group_job.py, 0 of 30 without)."""
    from _procs import assert_snippet_runs

    assert_snippet_runs(
        "import sys\n"
        "import unirank.runtime.snapshots, unirank.runtime.snapshotload\n"
        "import unirank.runtime.snapshotcopies, unirank.runtime.snapshotpages\n"
        "assert 'torch.distributed.checkpoint' not in sys.modules, 'DCP imported'\n")
