"""``ur.state_writer`` / ``ur.state_reader`` (unirank's tiers as DCP storage) run for real, with
the program's own ``dcp.save``, ``dcp.async_save`` and ``dcp.load``: under ``unirank run`` (2
gloo ranks on one node) a restarted world restores the last step from the node's memory, bit
for bit, and the disk folder gets every 4th step (copied from memory, readable by DCP's own
reader) and the last step as the run ends; under a plain ``python`` the folder only; a save
that fails on one rank counts for nothing and does not hold up the next one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _procs import Runner, launcher_free_environ
from _state_programs import DIGEST
from _state_programs import records as _records

#: 6 steps of a deterministic update on 1 MiB per rank, each saved with the program's own
#: ``dcp.save`` (``dcp.async_save`` where ASYNC is set) into ``ur.state_writer``; attempt 0's
#: rank 1 fails after saving step 3 where FAIL is set; with BREAK, step 2's save fails on
#: rank 1 (a value that cannot be pickled) and every rank goes on; JSON lines on stdout
PROGRAM = DIGEST + r"""
import json, os, sys
import torch
import torch.distributed.checkpoint as dcp
import unirank as ur

class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("this value cannot be saved")

ur.init(backend="gloo")
rank = ur.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(512, 512)
state = {"model": model.state_dict(), "step": -1}
reader = ur.state_reader(folder=os.environ.get("DISK"))
restored = None
if reader is not None:
    dcp.load(state, storage_reader=reader)
    restored = reader.step
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
print(json.dumps({"rank": rank, "attempt": attempt, "restored": restored,
                  "digest": digest(state) if restored is not None else None,
                  "from": ur.restored_from()}), flush=True)
pending = None
for step in range(0 if restored is None else restored + 1, 6):
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5).add_(step)
    state["step"] = step
    saved = dict(state)
    if os.environ.get("BREAK") and step == 2 and rank == 1:
        saved["extra"] = Unpicklable()
    writer = ur.state_writer(step, folder=os.environ.get("DISK"), persist_every=4)
    try:
        if os.environ.get("ASYNC"):
            pending = dcp.async_save(saved, storage_writer=writer)
            pending.result()
        else:
            dcp.save(saved, storage_writer=writer)
    except dcp.api.CheckpointException as exc:  # a BaseException, not an Exception
        print(json.dumps({"rank": rank, "failed": step, "error": type(exc).__name__}),
              flush=True)
        continue
    print(json.dumps({"rank": rank, "attempt": attempt, "saved": step,
                      "digest": digest(state)}), flush=True)
    if step == 3 and attempt == 0 and rank == 1 and os.environ.get("FAIL"):
        sys.exit(3)
ur.finalize()
"""


def _plain_python(script: Path, disk: Path) -> subprocess.CompletedProcess[str]:
    env = launcher_free_environ({"DISK": str(disk), "TORCHELASTIC_RESTART_COUNT": "0"})
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=120, cwd=script.parent)


@pytest.mark.parametrize("mode", ["save", "async_save"])
def test_a_restarted_world_restores_dcp_s_save_from_the_node_s_memory(
        runner: Runner, tmp_path: Path, mode: str) -> None:
    shm, disk = tmp_path / "shm", tmp_path / "disk"
    shm.mkdir()
    script = runner.script("train.py", PROGRAM)
    env = {"UNIRANK_STATE_SHM": str(shm), "DISK": str(disk), "FAIL": "1"}
    if mode == "async_save":
        env["ASYNC"] = "1"
    result = runner.run(["-n", "2", "--max-restarts", "1", str(script)], env=env)
    assert result.returncode == 0, result.stderr
    records = _records(result.stdout)
    saved = {(r["rank"], r["saved"]): r["digest"] for r in records if "saved" in r}
    restores = [r for r in records if "restored" in r and r["attempt"] == 1]
    assert len(restores) == 2, result.stdout
    for restore in restores:
        assert restore["restored"] == 3, restore
        assert restore["digest"] == saved[(restore["rank"], 3)], restore
        assert restore["from"] == "state of step 3 restored from the nodes' memory"
    assert "unirank: state of step 3 restored from the nodes' memory in " in result.stderr
    assert sorted(os.listdir(shm)) == []
    # steps 0 and 4 copied from memory by the writer, step 5 by unirank run as it ended
    assert sorted(os.listdir(disk)) == ["step-0", "step-4", "step-5"]
    assert f"unirank run: the state of step 5 kept in {disk} (from this node's memory)" \
        in result.stderr
    # the writer's copy of step 4 is a checkpoint DCP's own reader reads
    shutil.rmtree(disk / "step-5")
    again = _plain_python(script, disk)
    restore = _records(again.stdout)[0]
    assert restore["restored"] == 4 and restore["digest"] == saved[(0, 4)], again.stderr


def test_without_unirank_run_dcp_s_save_goes_to_the_folder_only(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    first = _plain_python(script, tmp_path / "disk")
    assert first.returncode == 0, first.stderr
    assert first.stderr.count("no unirank run here: the job's state is kept in "
                              f"{tmp_path / 'disk'} only") == 1, first.stderr
    assert sorted(os.listdir(tmp_path / "disk")) == ["step-4", "step-5"]  # the newest 2
    again = _plain_python(script, tmp_path / "disk")
    restore = _records(again.stdout)[0]
    last = next(r for r in _records(first.stdout) if r.get("saved") == 5)
    assert restore["restored"] == 5 and restore["digest"] == last["digest"], again.stdout
    assert "unirank: state of step 5 restored from the disk folder in " in again.stderr


def test_a_save_that_fails_on_one_rank_counts_for_nothing_and_the_next_goes_on(
        runner: Runner, tmp_path: Path) -> None:
    """Step 2's save fails on rank 1 (DCP then never calls rank 0's ``finish``): the other
    ranks' copies are told at rank 0's next save, in seconds (they waited 300 s for rank
    0's before), and the step never counts."""
    shm = tmp_path / "shm"
    shm.mkdir()
    script = runner.script("train.py", PROGRAM)
    result = runner.run(["-n", "2", str(script)], timeout=100,
                        env={"UNIRANK_STATE_SHM": str(shm), "BREAK": "1",
                             "UNIRANK_STATE_DIR": ""})
    assert result.returncode == 0, result.stderr
    records = _records(result.stdout)
    assert sorted(r["rank"] for r in records if r.get("failed") == 2) == [0, 1], result.stdout
    assert sorted(r["rank"] for r in records if r.get("saved") == 5) == [0, 1], result.stdout


def test_a_writer_with_nowhere_to_write_is_refused_in_one_line(tmp_path: Path) -> None:
    script = tmp_path / "nowhere.py"
    script.write_text("import unirank as ur\nur.init(backend='gloo')\nur.state_writer(0)\n")
    env = launcher_free_environ({})
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                            text=True, timeout=120, cwd=tmp_path)
    assert result.returncode != 0
    assert "ValueError: ur.state_writer: no unirank run holds the state in memory and no " \
        "folder was named: give folder= or set UNIRANK_STATE_DIR" in result.stderr
