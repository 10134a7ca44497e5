"""The hang detector on real ``unirank run`` jobs (gloo, 2-4 ranks, ``--hang-report-after 2``):
a rank that skips an all_reduce, a rank that calls broadcast where the others all_reduce, a
rank blocked forever in the program's own code; each report names the rank, its node, the op,
its sequence number and the lines of the script. Without ``--hang-timeout`` the job goes on
(and ends well once the late rank comes); with it the job ends with exit code 86 and the hang
as the failure summary's root cause. A rank that computes alone for less than the threshold
while the others wait is never reported.

The scripts synchronise through a FIFO the test writes to and the store, never through sleeps."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from _procs import Runner, free_port, read_lines

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _outputs import console_script

if TYPE_CHECKING:
    from conftest import SlurmTestbed

pytestmark = pytest.mark.integration

FAST = ["--hang-report-after", "2"]

SKIP = """import os
import pathlib

import torch
import torch.distributed as dist

RELEASE = pathlib.Path(os.environ["RELEASE_FILE"])


def idle_after_skipping():
    RELEASE.read_text()  # a FIFO: blocks until the test writes to it


dist.init_process_group("gloo")
t = torch.ones(1024)
dist.all_reduce(t)
if dist.get_rank() == 1:
    idle_after_skipping()  # the others' all_reduce #2 waits for it
dist.all_reduce(t)  # the all_reduce rank 1 is late for
print("done", dist.get_rank(), t[0].item())
dist.destroy_process_group()
"""

MISMATCH = """import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
if dist.get_rank() == 1:
    dist.broadcast(t, 0)  # the mismatched call
else:
    dist.all_reduce(t)  # the others' call
"""

BLOCKED = """import threading

import torch
import torch.distributed as dist


def load_next_batch():
    threading.Event().wait()  # blocks forever


dist.init_process_group("gloo")
t = torch.ones(8, dtype=torch.float64)
dist.all_reduce(t)
if dist.get_rank() == 2:
    load_next_batch()
dist.all_reduce(t)  # the all_reduce rank 2 never enters
"""

ALONE = """import json
import os
import time

import torch.distributed as dist

from unirank.hang.exchange import progress_key

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()


def record(store, r):
    return json.loads(store.get(progress_key(r))) if store.check([progress_key(r)]) else {}


def waiting(rec):
    return any(g["entered"] > g["done"] for g in rec.get("groups", ()))


def compute_alone():
    # until every other rank's record says it waits in the barrier, and rank 0's own record
    # (whose thread runs the detector right after publishing) was published twice since
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False)
    while not all(waiting(record(store, r)) for r in range(1, world)):
        time.sleep(0.05)
    seen = record(store, 0)["time"]
    for _ in range(2):
        while record(store, 0)["time"] == seen:
            time.sleep(0.05)
        seen = record(store, 0)["time"]


if rank == 0:
    compute_alone()
dist.barrier()
print("finished", rank)
"""

THREADS = """import os
import signal
import threading

import torch.distributed as dist

dist.init_process_group("gloo")
names = sorted(t.name for t in threading.enumerate())
# the recorder's size reaches torch, not the program's environment
print("threads", names, "environ", os.environ.get("TORCH_FR_BUFFER_SIZE"),
      "C environ", os.popen("env").read().count("TORCH_FR"))
# the watcher takes none of the program's signals: they go to the main thread
for thread in threading.enumerate():
    if thread.name == "unirank-hang-watch":
        status = open(f"/proc/self/task/{thread.native_id}/status").read()
        blocked = int(status.split("SigBlk:")[1].split()[0], 16)
        print("watcher blocks", [sig.name for sig in (signal.SIGINT, signal.SIGTERM,
                                 signal.SIGUSR1, signal.SIGUSR2) if blocked >> (sig - 1) & 1])
"""


def line_of(script: str, marker: str) -> int:
    return next(i for i, line in enumerate(script.splitlines(), 1) if marker in line)


def _report(err_lines: list[str]) -> str:
    return "\n".join(err_lines)


def test_a_rank_skipping_an_all_reduce_is_reported_and_the_job_goes_on(
        runner: Runner, tmp_path: Path) -> None:
    runner.script("skip.py", SKIP)
    release = tmp_path / "release"
    os.mkfifo(release)
    proc = runner.start([*FAST, "--log-dir", str(tmp_path / "logs"), "--rdzv-id", "r1",
                         "-n", "4", "skip.py"], env={"RELEASE_FILE": str(release)})
    lines = read_lines(proc.stderr, 1, contains="every rank's stack:")
    release.write_text("go")
    out, rest = proc.communicate(timeout=120)
    err = _report(lines) + rest.decode()
    late, idle = line_of(SKIP, "the all_reduce rank 1 is late for"), line_of(SKIP, "a FIFO")
    wavefront = (rf"^  ranks 0, 2-3 \((\S+)\) wait in all_reduce #2 \(float32\[1024\], "
                 rf"skip.py:{late}\) since \d+ s; rank 1 \(\1\) has not entered it: its main "
                 rf"thread is in idle_after_skipping \(skip.py:{idle}\)$")
    assert re.search(wavefront, err, re.M), err
    assert re.search(r"^unirank: HANG \(report 1\)", err, re.M), err
    assert "  rank 1 (" in err and f'skip.py", line {idle}, in idle_after_skipping' in err, err
    assert proc.returncode == 0, err  # reported, never ended
    assert sorted(out.decode().split("\n")[:-1]) == [f"done {r} 16.0" for r in range(4)]
    [dumps] = (tmp_path / "logs").glob("r1_*/attempt_0/hang")
    assert (dumps / "report-1.txt").read_text().count("Thread MainThread:") >= 4
    assert '"stacks"' in (dumps / "report-1.json").read_text()


def test_broadcast_against_all_reduce_ends_the_job_with_the_hang_timeout(
        runner: Runner) -> None:
    runner.script("mismatch.py", MISMATCH)
    ended = runner.run([*FAST, "--hang-timeout", "3", "-n", "3", "mismatch.py"])
    err = ended.stderr
    assert re.search(rf"^  mismatch: rank 1 \((\S+)\) called broadcast #2 \(float32\[4\], "
                     rf"mismatch.py:{line_of(MISMATCH, 'mismatched')}\), ranks 0, 2 \(\1\) "
                     rf"all_reduce #2 \(float32\[4\], mismatch.py:{line_of(MISMATCH, 'the others')}"
                     r"\)$", err, re.M), err
    assert ended.returncode == 86, err
    assert "  ending the job (--hang-timeout 3 s, exit code 86)" in err, err
    # the rank that called another op is blamed, and the error line keeps the mismatch
    assert re.search(r"^unirank run: FAILED \(exit code 86\): rank 1 ", err, re.M), err
    assert re.search(r"^  error: HangTimeoutError: no progress for 3 s \(--hang-timeout\): "
                     rf"mismatch: rank 1 \(\S+\) called broadcast #2 \(float32\[4\], "
                     rf"mismatch.py:{line_of(MISMATCH, 'mismatched')}\), ranks 0, 2 ", err,
                     re.M), err
    # without --log-dir the run's temporary folder is kept for its reports, and named
    kept = re.search(r"^unirank run: hang reports kept in (\S+) \(removed by a later run 7 days "
                     r"after this one\)$", err, re.M)
    assert kept and (Path(kept[1]) / "attempt_0" / "hang" / "report-1.txt").exists(), err
    shutil.rmtree(kept[1])


def test_a_rank_blocked_in_its_own_code_is_named_with_its_stack(runner: Runner) -> None:
    runner.script("blocked.py", BLOCKED)
    ended = runner.run([*FAST, "--hang-timeout", "3", "-n", "3", "blocked.py"])
    err = ended.stderr
    never, wait = line_of(BLOCKED, "never enters"), line_of(BLOCKED, "blocks forever")
    assert re.search(rf"^  ranks 0-1 \((\S+)\) wait in all_reduce #2 \(float64\[8\], "
                     rf"blocked.py:{never}\) since \d+ s; rank 2 \(\1\) has not entered it: "
                     rf"its main thread is in load_next_batch \(blocked.py:{wait}\)$",
                     err, re.M), err
    assert f'blocked.py", line {wait}, in load_next_batch' in err, err
    assert ended.returncode == 86, err
    # the rank that did not come is blamed, not rank 0 that waits
    assert re.search(r"^unirank run: FAILED \(exit code 86\): rank 2 ", err, re.M), err


def test_a_rank_computing_alone_below_the_threshold_is_not_reported(runner: Runner) -> None:
    runner.script("alone.py", ALONE)
    ended = runner.run(["--hang-report-after", "30", "-n", "3", "alone.py"],
                       env={"UNIRANK_HANG_INTERVAL": "0.25"})
    assert ended.returncode == 0, ended.stderr
    assert sorted(ended.stdout.split("\n")[:-1]) == [f"finished {r}" for r in range(3)]
    assert "HANG" not in ended.stderr, ended.stderr


@pytest.mark.parametrize("setting", [[], ["--hang-report-after", "off"]], ids=["on", "off"])
def test_the_watcher_thread_and_the_recorder(runner: Runner, setting: list[str]) -> None:
    runner.script("threads.py", THREADS)
    ended = runner.run([*setting, "-n", "1", "threads.py"])
    assert ended.returncode == 0, ended.stderr
    if setting:
        assert ended.stdout == "threads ['MainThread'] environ None C environ 0\n"
    else:
        assert ended.stdout == ("threads ['MainThread', 'unirank-hang-watch'] environ None "
                                "C environ 0\nwatcher blocks ['SIGINT', 'SIGTERM', 'SIGUSR1', "
                                "'SIGUSR2']\n")


UR_INIT = """import os

import torch
import torch.distributed as dist
import unirank as ur


def stuck_before_reduce():
    open(os.environ["RELEASE_FILE"]).read()  # a FIFO: blocks until the test writes to it


ur.init("gloo")
t = torch.ones(3)
dist.all_reduce(t)
if dist.get_rank() == 1:
    stuck_before_reduce()
dist.all_reduce(t)  # the second all_reduce
os.write(1, f"ok {dist.get_rank()}\\n".encode())  # one write: torchrun's ranks share stdout
"""


def test_under_torchrun_ur_init_starts_the_watcher(runner: Runner, tmp_path: Path) -> None:
    """One task per rank (torchrun): ``ur.init`` starts each rank's watcher; rank 0 reports,
    and the ranks end cleanly (the watcher is stopped before the interpreter's teardown)."""
    torchrun = shutil.which("torchrun")
    assert torchrun, "torchrun comes with torch"
    runner.script("urinit.py", UR_INIT)
    release = tmp_path / "release"
    os.mkfifo(release)
    proc = runner.start(command=[torchrun, "--nproc-per-node", "2", "--master-port",
                                 str(free_port()), "urinit.py"],
                        env={"RELEASE_FILE": str(release), "UNIRANK_HANG_REPORT_AFTER": "2"})
    lines = read_lines(proc.stderr, 1, contains="every rank's stack:")
    release.write_text("go")
    out, rest = proc.communicate(timeout=120)
    err = _report(lines) + rest.decode()
    assert re.search(rf"^  rank 0 \((\S+)\) waits in all_reduce #2 \(float32\[3\], "
                     rf"urinit.py:{line_of(UR_INIT, 'the second')}\) since \d+ s; rank 1 "
                     rf"\(\1\) has not entered it: its main thread is in stuck_before_reduce "
                     rf"\(urinit.py:{line_of(UR_INIT, 'a FIFO')}\)$", err, re.M), err
    assert proc.returncode == 0, err
    assert sorted(out.decode().split("\n")[:-1]) == ["ok 0", "ok 1"]


def test_two_nodes_report_through_the_store_and_the_hang_timeout_ends_both(
        runner: Runner) -> None:
    """Two ``unirank run --nnodes 2`` (node names nodeA, nodeB), rank 3 on nodeB blocked:
    rank 0 on nodeA reports it with its node, and ``--hang-timeout`` ends both nodes' runs
    (nodeB's ranks end themselves: no collective error would reach them)."""
    runner.script("blocked4.py", BLOCKED.replace("get_rank() == 2", "get_rank() == 3"))
    port = str(free_port())
    common = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", port, "-n", "2",
              *FAST, "--hang-timeout", "3", "blocked4.py"]
    procs = [runner.start(["--node-rank", str(node), *common],
                          env={"UNIRANK_NODE_NAME": name})
             for node, name in enumerate(("nodeA", "nodeB"))]
    (_, err_a), (_, err_b) = (p.communicate(timeout=120) for p in procs)
    a, b = err_a.decode(), err_b.decode()
    assert re.search(rf"^  ranks 0-2 \(nodeA, nodeB\) wait in all_reduce #2 \(float64\[8\], "
                     rf"blocked4.py:{line_of(BLOCKED, 'never enters')}\) since \d+ s; rank 3 "
                     rf"\(nodeB\) has not entered it: its main thread is in load_next_batch",
                     a, re.M), a
    assert [p.returncode for p in procs] == [86, 86], a + b
    assert "FAILED (exit code 86): rank 3 (local rank 1) on node nodeB" in b, b
    assert re.search(r"^  error: HangTimeoutError: no progress for 3 s \(--hang-timeout\): "
                     r"ranks 0-2 .* rank 3 \(nodeB\) has not entered it", a, re.M), a


def _stacks(runner: Runner, job: str) -> tuple[int, str, str]:
    ended = subprocess.run([sys.executable, "-m", "unirank", "stacks", "--job", job],
                           cwd=runner.cwd, env=runner.environ(), capture_output=True, text=True,
                           timeout=60)
    return ended.returncode, ended.stdout, ended.stderr


def test_unirank_stacks_shows_every_rank_now_without_stopping_anything(
        runner: Runner, tmp_path: Path) -> None:
    """``unirank stacks --job ID`` from another shell, while rank 1 idles and the others wait
    (below the report delay: no report): every rank's progress and stacks, grouped; the job
    then goes on and ends well, and its job file goes with it."""
    runner.script("skip.py", SKIP)
    release = tmp_path / "release"
    os.mkfifo(release)
    job = f"stacks-{os.getpid()}"
    proc = runner.start(["--rdzv-id", job, "-n", "4", "skip.py"],
                        env={"RELEASE_FILE": str(release), "UNIRANK_HANG_INTERVAL": "0.25"})
    wanted = re.compile(r"^  ranks 0, 2-3 \(\S+\): waiting in all_reduce #2 \(float32\[1024\], "
                        rf"skip.py:{line_of(SKIP, 'is late for')}\) for \d+ s; main thread in "
                        r"<module> .*\n  rank 1 \(\S+\): finished collective #1; main thread in "
                        rf"idle_after_skipping \(skip.py:{line_of(SKIP, 'a FIFO')}\)$", re.M)
    deadline = time.monotonic() + 90
    out = ""
    while not wanted.search(out):  # until every rank is in place (each try: a real command)
        assert time.monotonic() < deadline and proc.poll() is None, out
        code, out, err = _stacks(runner, job)
        assert code in (0, 2), err  # 2: the job file is not written yet
    assert out.startswith(f"unirank stacks: job {job}, 4 ranks\n"), out
    assert f'skip.py", line {line_of(SKIP, "a FIFO")}, in idle_after_skipping' in out, out
    release.write_text("go")
    _, err_bytes = proc.communicate(timeout=120)
    assert proc.returncode == 0 and b"HANG" not in err_bytes, err_bytes.decode()
    code, _, err = _stacks(runner, job)
    assert code == 2 and "no running unirank job" in err, err


@pytest.mark.slurm
def test_srun_two_nodes_name_the_rank_and_its_node(slurm_testbed: SlurmTestbed,
                                                   tmp_path: Path) -> None:
    """``srun -N2 unirank run -n 2`` on the testbed, rank 3 (node2) blocked in its own code:
    rank 0 names it with its node, the line, the op and its number; ``--hang-timeout`` ends
    both nodes' steps with exit code 86."""
    (tmp_path / "blocked4.py").write_text(BLOCKED.replace("get_rank() == 2", "get_rank() == 3"))
    result = slurm_testbed.srun(
        ["-N2", "--ntasks-per-node=1", f"--chdir={tmp_path}", console_script("unirank"), "run",
         "-n", "2", *FAST, "--hang-timeout", "4", "blocked4.py"], timeout=120, check=False)
    err = result.stderr
    assert re.search(rf"^  ranks 0-2 \(node1, node2\) wait in all_reduce #2 \(float64\[8\], "
                     rf"blocked4.py:{line_of(BLOCKED, 'never enters')}\) since \d+ s; rank 3 "
                     rf"\(node2\) has not entered it: its main thread is in load_next_batch "
                     rf"\(blocked4.py:{line_of(BLOCKED, 'blocks forever')}\)$", err, re.M), err
    assert result.returncode == 86, err
    assert "FAILED (exit code 86): rank 3 (local rank 1) on node node2" in err, err
