"""``ur.save_state`` / ``ur.load_state`` run for real: under ``unirank run`` (2 gloo ranks on
one node) a worker that fails is restarted and the world restores the last step from the
node's memory, bit for bit; every few steps a snapshot also goes to disk; under a plain
``python`` the same calls keep the state on disk only and say so once; the run's snapshot
memory is gone when the run ends."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from _procs import Runner
from _state_programs import DIGEST
from _state_programs import records as _records

#: a training loop: 6 steps of a deterministic update on 1 MiB of state per rank; attempt 0's
#: rank 1 fails after saving step 3; every step's digest (and what was restored)
#: goes to a JSON line on stdout
PROGRAM = DIGEST + r"""
import json, os, sys
import torch
import unirank as ur

ur.init(backend="gloo")
rank = ur.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(512, 512)  # 1 MiB of weights (the same on every rank)
state = {"model": model.state_dict(), "step": -1}
restored = ur.load_state(state, folder=os.environ.get("DISK"))
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(json.dumps({"rank": rank, "attempt": attempt, "restored": restored,
                  "digest": digest(state) if restored is not None else None,
                  "from": ur.restored_from(),
                  "elastic": ur.elastic_state().state_restored}), flush=True)
first = 0 if restored is None else restored + 1
for step in range(first, 6):
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5).add_(step + rank * 0)
    state["step"] = step
    ur.save_state(step, state, folder=os.environ.get("DISK"), persist_every=4)
    print(json.dumps({"rank": rank, "attempt": attempt, "saved": step,
                      "digest": digest(state)}), flush=True)
    if step == 3 and attempt == 0 and rank == 1 and os.environ.get("FAIL"):
        sys.exit(3)
ur.finalize()
"""


def test_a_restarted_world_restores_the_last_step_from_the_node_s_memory(
        runner: Runner, tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    script = runner.script("train.py", PROGRAM)
    result = runner.run(["-n", "2", "--max-restarts", "1", str(script)],
                        env={"UNIRANK_STATE_SHM": str(shm), "DISK": str(tmp_path / "disk"),
                             "FAIL": "1"})
    assert result.returncode == 0, result.stderr
    records = _records(result.stdout)
    saved = {(r["rank"], r["saved"]): r["digest"] for r in records
             if "saved" in r and r["attempt"] == 0}
    restores = [r for r in records if "restored" in r and r["attempt"] == 1]
    assert len(restores) == 2, result.stdout
    for restore in restores:
        # rank 1 failed after saving step 3; rank 0 may have saved step 4 alone: never used
        assert restore["restored"] == 3, restore
        assert restore["digest"] == saved[(restore["rank"], 3)], restore
        assert restore["from"] == "state of step 3 restored from the nodes' memory"
        assert restore["elastic"] == restore["from"]  # ur.elastic_state() says it too
    assert "unirank: state of step 3 restored from the nodes' memory in " in result.stderr
    assert sorted(os.listdir(shm)) == []  # the run's memory went with it
    # the disk folder got steps 0 and 4 (every 4th), and step 5 from the memory at the end
    assert sorted(os.listdir(tmp_path / "disk")) == ["step-0", "step-4", "step-5"]
    assert f"unirank run: the state of step 5 kept in {tmp_path / 'disk'} (from this node's " \
        "memory)" in result.stderr


def test_without_unirank_run_the_state_is_kept_on_disk_only(tmp_path: Path) -> None:
    import subprocess

    from _procs import launcher_free_environ

    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    env = launcher_free_environ({"DISK": str(tmp_path / "disk"),
                                 "TORCHELASTIC_RESTART_COUNT": "0"})
    first = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stderr.count("no unirank run here: the job's state is kept in "
                              f"{tmp_path / 'disk'} only") == 1, first.stderr
    again = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
    restore = _records(again.stdout)[0]
    last = next(r for r in _records(first.stdout) if r.get("saved") == 5)
    assert restore["restored"] == 5 and restore["digest"] == last["digest"], again.stdout
    assert restore["from"] == "state of step 5 restored from the disk folder"


#: a loop that saves every step (to memory only: persist_every=0) and never handles a stop;
#: rank 0 writes "ready" to the FIFO after step 3
STOPPED = PROGRAM.replace('persist_every=4', 'persist_every=0').replace(
    "    if step == 3 and attempt == 0 and rank == 1 and os.environ.get(\"FAIL\"):\n"
    "        sys.exit(3)\n",
    "    if step == 3 and rank == 0 and os.environ.get(\"FIFO\"):\n"
    "        open(os.environ[\"FIFO\"], \"w\").write(\"ready\")\n"
    "    time.sleep(0.05)\n").replace("range(first, 6)", "range(first, 10**6)").replace(
    "import json, os, sys\n", "import json, os, sys, time\n")


def test_a_stopped_run_keeps_its_newest_step_on_disk_and_the_next_run_resumes_there(
        runner: Runner, tmp_path: Path) -> None:
    """SIGTERM to ``unirank run`` while the workers train (they do not handle it): as the run
    ends it copies the newest step the node holds whole from memory to the disk folder; the
    next run resumes there: the last step printed as saved, or the one before where the kill
    came while the thread still wrote it (a program that stops at ``ur.stop_requested()``
    keeps its last step: that save ends before it returns), or one saved after the last line
    printed."""
    import select
    import signal

    assert "persist_every=0" in STOPPED and "ready" in STOPPED
    fifo = tmp_path / "ready.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    keep = os.open(fifo, os.O_WRONLY)
    script = runner.script("train.py", STOPPED)
    env = {"DISK": str(tmp_path / "disk"), "FIFO": str(fifo)}
    try:
        proc = runner.start(["-n", "2", str(script)], env=env, text=True)
        assert select.select([reader], [], [], 120)[0], "step 3 never came"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        os.close(reader)
        os.close(keep)
    assert proc.returncode == 128 + signal.SIGTERM, err
    saved = {r["saved"]: r["digest"] for r in _records(out) if "saved" in r}
    last = max(saved)
    kept = [line for line in err.splitlines() if "kept in" in line]
    assert len(kept) == 1 and kept[0].startswith("unirank run: the state of step "), err
    step = int(kept[0].split("step ")[1].split()[0])
    assert step in (last - 1, last, last + 1), (step, last)
    resumed = runner.start(["-n", "2", str(script)], env={"DISK": str(tmp_path / "disk")},
                           text=True)
    first = json.loads(resumed.stdout.readline())
    resumed.send_signal(signal.SIGTERM)
    resumed.communicate(timeout=120)
    assert first["restored"] == step, first
    assert first["from"] == f"state of step {step} restored from the disk folder"
    if step in saved:
        assert first["digest"] == saved[step]


def test_a_snapshot_over_the_memory_budget_goes_to_disk_and_says_so_once(
        runner: Runner, tmp_path: Path) -> None:
    script = runner.script("train.py", PROGRAM)
    result = runner.run(["-n", "2", "--max-restarts", "1", "--state-budget", "1K", str(script)],
                        env={"DISK": str(tmp_path / "disk"), "FAIL": "1"})
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "does not fit" in line]
    # once per attempt (each attempt's rank 0 is a new process)
    assert said == [
        "unirank: a snapshot of 4.0 MiB does not fit the node's snapshot memory (0 B held, "
        "budget 1.0 KiB): the job's state goes to the disk folder only while it does not fit "
        "(the budget: unirank run --state-budget or UNIRANK_STATE_BUDGET, default 50% of "
        "/dev/shm or of the memory available, the smaller)"] * 2, result.stderr
    restores = [r for r in _records(result.stdout) if "restored" in r and r["attempt"] == 1]
    assert [r["from"] for r in restores] == ["state of step 3 restored from the disk folder"] * 2


TRUNCATE = """
import glob, os, sys
import torch
import unirank as ur

ur.init(backend="gloo")
state = {"w": torch.arange(1000.0), "step": -1}
restored = ur.load_state(state)
print("restored", restored, ur.restored_from(), flush=True)
if restored is None:
    for step in range(4):
        state["w"] += 1
        state["step"] = step
        ur.save_state(step, state)
    ur.finalize()  # the last save's thread ends first
    # the newest snapshot's data cut short in the node's memory
    part = glob.glob(os.path.join(os.environ["UNIRANK_STATE_MEMORY"], "step-3", "*.distcp"))[0]
    os.truncate(part, os.path.getsize(part) // 2)
    sys.exit(3)
print("w0", float(state["w"][0]), "step", state["step"], flush=True)
"""


def test_a_truncated_copy_is_not_restored_the_step_before_is(runner: Runner) -> None:
    script = runner.script("cut.py", TRUNCATE)
    result = runner.run(["-n", "1", "--max-restarts", "1", str(script)])
    assert result.returncode == 0, result.stderr
    assert "restored 2 state of step 2 restored from the nodes' memory" in result.stdout
    assert "w0 3.0 step 2" in result.stdout, result.stdout


def test_a_call_before_the_process_group_is_refused_in_one_line(runner: Runner) -> None:
    script = runner.script("early.py", "import torch, unirank as ur\n"
                                       "ur.save_state(0, {'w': torch.zeros(1)})\n")
    result = runner.run(["-n", "2", str(script)])
    assert result.returncode != 0
    assert "RuntimeError: ur.save_state needs the job's process group: call it after " \
        "ur.init() (or torch.distributed.init_process_group), on every rank" in result.stderr


#: a training loop with an optimizer and 4 MiB of weights (written by the save's thread, by
#: reference): the next step's optimizer.step() comes at once after each save; attempt 0's
#: rank 1 fails after saving step 3
OPTIMIZED = DIGEST + r"""
import json, os, sys
import torch
import unirank as ur

ur.init(backend="gloo")
rank = ur.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(1024, 1024)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": -1}
restored = ur.load_state(state)
if restored is not None:
    optimizer.load_state_dict(state["optimizer"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(json.dumps({"rank": rank, "attempt": attempt, "restored": restored,
                  "digest": digest(state) if restored is not None else None}), flush=True)
for step in range(0 if restored is None else restored + 1, 6):
    model(torch.ones(8, 1024)).sum().backward()
    optimizer.step()  # changes the weights in place: waits until the last save wrote them
    optimizer.zero_grad()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
    ur.save_state(step, state)
    print(json.dumps({"rank": rank, "attempt": attempt, "saved": step,
                      "digest": digest(state)}), flush=True)
    if step == 3 and attempt == 0 and rank == 1:
        sys.exit(3)
ur.finalize()
"""


def test_an_optimizer_step_right_after_a_save_waits_for_it_and_the_step_is_kept(
        runner: Runner, tmp_path: Path) -> None:
    """The weights are written by the save's thread while the loop goes on; the optimizer's
    next step, which changes them in place, waits until they are written: every step is
    kept whole (none dropped as changed while written), and the restarted world restores
    the newest one, bit for bit."""
    script = runner.script("train.py", OPTIMIZED)
    result = runner.run(["-n", "2", "--max-restarts", "1", str(script)])
    assert result.returncode == 0, result.stderr
    assert "was not kept" not in result.stderr, result.stderr
    records = _records(result.stdout)
    saved = {(r["rank"], r["saved"]): r["digest"] for r in records
             if "saved" in r and r["attempt"] == 0}
    restores = [r for r in records if "restored" in r and r["attempt"] == 1]
    assert [r["restored"] for r in restores] == [3, 3], result.stdout
    assert all(r["digest"] == saved[(r["rank"], 3)] for r in restores), (restores, saved)
