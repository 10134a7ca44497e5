"""More of the issue's hangs on real runs (gloo, ``--hang-report-after 2``): a rank whose
DataLoader worker deadlocks in its dataset's ``__getitem__`` (the report names the rank, its
main thread's line and that it waits for a DataLoader worker); a rank frozen by SIGSTOP (named
as not answering); a hang under ``mpirun -np 2`` (one task per rank, ``ur.init``).

The scripts synchronise through stdout lines and the reports, never through sleeps."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from _hang_scripts import blocked
from _procs import Runner, free_port, launcher_free_environ, read_lines

pytestmark = pytest.mark.integration

FAST = ["--hang-report-after", "2", "--hang-timeout", "4", "--grace-period", "1"]

LOADER = """import threading

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        if dist.get_rank() == 1:
            threading.Event().wait()  # deadlocks in the DataLoader's worker process
        return torch.ones(2)


dist.init_process_group("gloo")
t = torch.ones(8)
dist.all_reduce(t)
loader = DataLoader(Samples(), batch_size=2, num_workers=1)
batch = next(iter(loader))  # rank 1 waits here for its worker
dist.all_reduce(t)  # the all_reduce rank 1 never enters
"""

FROZEN = """import os
import pathlib

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(8)
dist.all_reduce(t)
if dist.get_rank() == 1:
    os.write(1, f"pid {os.getpid()}\\n".encode())
    pathlib.Path(os.environ["RELEASE_FILE"]).read_text()  # a FIFO nobody writes to
dist.all_reduce(t)  # the all_reduce rank 1 never enters
"""


def line_of(script: str, marker: str) -> int:
    return next(i for i, line in enumerate(script.splitlines(), 1) if marker in line)


def test_a_dataloader_worker_deadlock_is_named(runner: Runner) -> None:
    runner.script("loader.py", LOADER)
    ended = runner.run([*FAST, "-n", "3", "loader.py"], env={"UNIRANK_HANG_INTERVAL": "0.5"})
    err = ended.stderr
    wavefront = (rf"^  ranks 0, 2 \((\S+)\) wait in all_reduce #2 \(float32\[8\], "
                 rf"loader.py:{line_of(LOADER, 'never enters')}\) since \d+ s; rank 1 \(\1\) "
                 rf"has not entered it: its main thread is in <module> "
                 rf"\(loader.py:{line_of(LOADER, 'waits here')}\), waiting for a DataLoader "
                 r"worker$")
    assert re.search(wavefront, err, re.M), err
    # the blocked worker's own stack: the line of the dataset's code it is stuck in
    assert re.search(r"^    Thread child process \d+:\n      File \"\S+loader.py\", line "
                     rf"{line_of(LOADER, 'deadlocks in')}, in __getitem__$", err, re.M), err
    assert ended.returncode == 86, err


def test_a_frozen_rank_is_named_as_not_answering(runner: Runner, tmp_path: Path) -> None:
    runner.script("frozen.py", FROZEN)
    release = tmp_path / "release"
    os.mkfifo(release)
    proc = runner.start([*FAST, "-n", "3", "frozen.py"],
                        env={"RELEASE_FILE": str(release), "UNIRANK_HANG_INTERVAL": "0.5"})
    pid = int(read_lines(proc.stdout, 1, contains="pid ")[-1].split()[-1])  # type: ignore[arg-type]
    os.kill(pid, signal.SIGSTOP)
    try:
        _, err_bytes = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:  # the test failed: let the frozen rank end with the rest
            os.kill(pid, signal.SIGCONT)
    err = err_bytes.decode()
    assert re.search(r"^  ranks 0, 2 \(\S+\) wait in all_reduce #2 \(float32\[8\], "
                     rf"frozen.py:{line_of(FROZEN, 'never enters')}\) since \d+ s; rank 1 ",
                     err, re.M), err
    assert re.search(r"^  rank 1 \(\S+\): no stack within \d+ s \(frozen, or its interpreter "
                     r"is held\)$", err, re.M), err
    assert proc.returncode == 86, err


#: rank 1 never enters the second all_reduce
MPI = blocked(2, 4)


def test_a_hang_under_mpirun_is_reported(mpirun: list[str], tmp_path: Path) -> None:
    (tmp_path / "mpi.py").write_text(MPI)
    ended = subprocess.run([*mpirun, "-np", "2", sys.executable, "mpi.py"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=90,
                           env=launcher_free_environ({"UNIRANK_HANG_INTERVAL": "0.5"}))
    err = ended.stderr
    assert re.search(rf"^  rank 0 \((\S+)\) waits in all_reduce #2 \(float32\[8\], "
                     rf"mpi.py:{line_of(MPI, 'never enters')}\) since \d+ s; rank 1 \(\1\) has "
                     rf"not entered it: its main thread is in load_next_batch "
                     rf"\(mpi.py:{line_of(MPI, 'blocks forever')}\)$", err, re.M), err
    assert "ending the job (hang_timeout=4, exit code 86)" in err, err
    assert ended.returncode != 0, err


RANK0_IDLE = """import os
import pathlib

import torch
import torch.distributed as dist
import unirank as ur

ur.init("gloo", hang_report_after=2)
t = torch.ones(8)
dist.all_reduce(t)
if dist.get_rank() == 0:
    os.write(1, f"pid {os.getpid()}\\n".encode())
    pathlib.Path(os.environ["RELEASE_FILE"]).read_text()  # a FIFO nobody writes to
dist.all_reduce(t)  # the all_reduce rank 0 never enters
"""


def test_a_frozen_rank_0_is_reported_by_rank_1(runner: Runner, tmp_path: Path) -> None:
    """torchrun (its agent serves the store): rank 0 frozen by SIGSTOP; rank 1, the lowest
    rank that still publishes, says it takes over and reports rank 0 as not answering."""
    torchrun = shutil.which("torchrun")
    assert torchrun, "torchrun comes with torch"
    runner.script("rank0.py", RANK0_IDLE)
    release = tmp_path / "release"
    os.mkfifo(release)
    proc = runner.start(command=[torchrun, "--nproc-per-node", "3", "--master-port",
                                 str(free_port()), "rank0.py"],
                        env={"RELEASE_FILE": str(release), "UNIRANK_HANG_INTERVAL": "0.5"})
    pid = int(read_lines(proc.stdout, 1, contains="pid ")[-1].split()[-1])  # type: ignore[arg-type]
    os.kill(pid, signal.SIGSTOP)
    try:
        lines = read_lines(proc.stderr, 1, contains="no stack within",  # type: ignore[arg-type]
                           timeout=60)
    finally:
        os.kill(pid, signal.SIGKILL)  # torchrun then stops the others
        _, rest = proc.communicate(timeout=90)
    err = "\n".join(lines) + rest.decode()
    assert ("unirank: rank 0 has sent no progress record for 8 s (frozen, or its interpreter "
            "is held): rank 1 looks for hangs instead") in err, err
    assert re.search(r"^  ranks 1-2 \(\S+\) wait in all_reduce #2 \(float32\[8\], "
                     rf"rank0.py:{line_of(RANK0_IDLE, 'never enters')}\) since \d+ s; rank 0 ",
                     err, re.M), err
    assert re.search(r"^  rank 0 \(\S+\): no stack within \d+ s", err, re.M), err
    assert err.count("looks for hangs instead") == 1, err  # rank 2 stays on standby


HELD = """import ctypes

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(8)
dist.all_reduce(t)
if dist.get_rank() == 0:
    ctypes.PyDLL(None).sleep(600)  # a C call that keeps the GIL: no thread of rank 0 runs
dist.all_reduce(t)  # the all_reduce rank 0 never enters
"""


def test_rank_0_with_its_interpreter_held_under_unirank_run(runner: Runner) -> None:
    """Rank 0 serves the store (which runs without the GIL) but its watcher cannot run: rank 1
    reports, and ``--hang-timeout`` ends the job from there."""
    runner.script("held.py", HELD)
    ended = runner.run([*FAST, "-n", "3", "held.py"], env={"UNIRANK_HANG_INTERVAL": "0.5"})
    err = ended.stderr
    reports = err.partition("unirank run: FAILED")[0]  # the summary may quote rank 1's stderr
    assert reports.count("looks for hangs instead") == 1, err
    assert "rank 1 looks for hangs instead" in err, err
    assert re.search(r"^  ranks 1-2 \(\S+\) wait in all_reduce #2 \(float32\[8\], "
                     rf"held.py:{line_of(HELD, 'never enters')}\) since \d+ s; rank 0 ",
                     err, re.M), err
    assert ended.returncode == 86, err
    assert re.search(r"^unirank run: FAILED \(exit code 86\): rank 1 ", err, re.M), err


NO_GROUP = """import ctypes
import os

import torch.distributed as dist

store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                      is_master=False)
if os.environ["RANK"] == "0":
    ctypes.PyDLL(None).sleep(12)  # rank 0's interpreter held past silent_after(0.5) = 8 s
    store.set("done", "1")
else:
    store.wait(["done"])
print("ok", os.environ["RANK"])
"""


def test_a_held_rank_0_with_nothing_to_report_is_no_news(runner: Runner) -> None:
    """Issue 34: a script with no process group got "rank 0 has sent no progress record for
    26 s (frozen ...): rank 1 looks for hangs instead" under load; with no hang to report, the
    standby says nothing."""
    runner.script("nogroup.py", NO_GROUP)
    ended = runner.run([*FAST, "-n", "2", "nogroup.py"], env={"UNIRANK_HANG_INTERVAL": "0.5"})
    assert ended.returncode == 0, ended.stderr
    assert sorted(ended.stdout.split("\n")[:-1]) == ["ok 0", "ok 1"], ended.stdout
    assert "looks for hangs" not in ended.stderr, ended.stderr
