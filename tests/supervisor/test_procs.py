"""Supervision, for real: ``unirank run`` with real worker processes (and real torch where the
script uses it). Fail-fast, exit codes, the failure summary, signal forwarding, and no orphans."""

from __future__ import annotations

import re
import signal
from typing import TYPE_CHECKING

import pytest

from _procs import SIGNAL_WAIT
from unirank.signals import STOP_SIGNALS

if TYPE_CHECKING:
    from _procs import Runner

pytestmark = pytest.mark.integration

# Every worker prints its pid, then all meet in a gloo barrier, so that no worker can fail before
# the others have said who they are.
_MEET = """
import os, sys, threading
import torch.distributed as dist
rank = int(os.environ["RANK"])
print(f"pid {os.getpid()} rank {rank}", flush=True)
dist.init_process_group("gloo")
dist.barrier()
"""

_HANG = "threading.Event().wait(100)\n"


def _pids(stdout: str) -> dict[int, int]:
    return {int(r): int(p) for p, r in re.findall(r"pid (\d+) rank (\d+)", stdout)}


def test_crash_stops_the_others_and_reports_the_traceback(runner: Runner) -> None:
    runner.script("crash.py", _MEET + """
def explode():
    raise ValueError(f"boom from rank {rank}")
if rank == 1:
    explode()
""" + _HANG)
    result = runner.run(["-n", "2", "crash.py"])
    assert result.returncode == 1, result.stderr
    pids = _pids(result.stdout)
    assert set(pids) == {0, 1}, (result.stdout, result.stderr)
    assert runner.wait_gone(list(pids.values())) == []
    summary = result.stderr[result.stderr.index("unirank run: FAILED"):]
    assert "rank 1 (local rank 1)" in summary
    assert "exit code 1" in summary
    assert 'raise ValueError(f"boom from rank {rank}")' in summary
    # the error's own line, and the traceback's last line once among rank 1's last lines
    assert "\n  error: ValueError: boom from rank 1\n" in summary
    assert summary.count("ValueError: boom from rank 1") == 2
    assert "rank 0: killed by SIGTERM" in summary
    # the worker's own traceback went through to stderr, without the bootstrap's frames
    assert result.stderr.count("ValueError: boom from rank 1") == 3
    assert "runpy" not in result.stderr and "bootstrap.py" not in result.stderr


def test_exit_code_is_the_first_failure_s(runner: Runner) -> None:
    runner.script("exit7.py", _MEET + "if rank == 1:\n    sys.exit(7)\n" + _HANG)
    result = runner.run(["-n", "2", "exit7.py"])
    assert result.returncode == 7, result.stderr
    assert "rank 1 (local rank 1) on node" in result.stderr
    assert "exit code 7" in result.stderr


def test_worker_killed_by_a_signal_gives_128_plus_signum(runner: Runner) -> None:
    runner.script("kill9.py", _MEET + "if rank == 0:\n"
                  "    os.kill(os.getpid(), 9)\n" + _HANG)
    result = runner.run(["-n", "2", "kill9.py"])
    assert result.returncode == 128 + 9, result.stderr
    assert "rank 0 (local rank 0)" in result.stderr
    assert "killed by SIGKILL (signal 9)" in result.stderr
    assert runner.wait_gone(list(_pids(result.stdout).values())) == []


def test_sigkill_after_the_grace_period(runner: Runner) -> None:
    runner.script("stubborn.py", """
import signal
from typing import TYPE_CHECKING
signal.signal(signal.SIGTERM, signal.SIG_IGN)
""" + _MEET + "if rank == 1:\n    sys.exit(3)\n" + _HANG)
    result = runner.run(["-n", "2", "--grace-period", "1", "stubborn.py"])
    assert result.returncode == 3, result.stderr
    assert "SIGKILL after 1 s" in result.stderr
    assert "rank 0: killed by SIGKILL" in result.stderr


def test_success_is_zero_and_silent(runner: Runner) -> None:
    runner.script("ok.py", _MEET + "print(f'done {rank}', flush=True)\n")
    result = runner.run(["-n", "2", "ok.py"])
    assert result.returncode == 0, result.stderr
    assert sorted(re.findall(r"done \d", result.stdout)) == ["done 0", "done 1"]
    assert "unirank run" not in result.stderr


# The handler only writes the signal's number to a pipe, which the main thread reads: raising
# from a handler could land while ``threading`` holds a lock (CPython then fails with "release
# unlocked lock"), so where the signal lands must not matter.
_WAIT_FOR_SIGNAL = SIGNAL_WAIT + """
import os, signal, sys
sig = signal.Signals[sys.argv[1]]
on_signals(sig)
rank = os.environ["RANK"]
print(f"ready {rank} {os.getpid()}", flush=True)
got = next_signal(100)
if got is None:
    sys.exit(5)
print(f"rank {rank} got {signal.Signals(got).name}", flush=True)
sys.exit(0 if got == sig else 6)
"""


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT,
                                 signal.SIGHUP])
def test_signals_are_forwarded_to_every_worker(runner: Runner, sig: signal.Signals) -> None:
    """By default torchrun's SIGTERM,SIGINT,SIGHUP,SIGQUIT and the ranks' stop signals (SIGUSR2
    and SIGTERM); SIGUSR1 when --signals-to-handle names it."""
    runner.script("waiter.py", _WAIT_FOR_SIGNAL)
    given = ["--signals-to-handle", "SIGUSR1"] if sig == signal.SIGUSR1 else []
    proc = runner.start([*given, "-n", "2", "waiter.py", sig.name])
    assert proc.stdout is not None
    lines = runner.read_lines(proc.stdout, 2, contains="ready")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=runner.timeout)
    text = "\n".join(lines) + out.decode()
    # a forwarded stop signal (SIGTERM, SIGINT, SIGHUP, SIGQUIT) stops the run: 128 + it,
    # although the ranks ended 0
    stops = sig in STOP_SIGNALS
    assert proc.returncode == (128 + sig if stops else 0), err.decode()
    assert f"rank 0 got {sig.name}" in text
    assert f"rank 1 got {sig.name}" in text


_THREAD_MASKS = """
import os, signal
asked = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2]
main = os.getpid()
for tid in sorted(int(t) for t in os.listdir("/proc/self/task")):
    with open(f"/proc/self/task/{tid}/status") as status:
        blocked = int(next(l for l in status if l.startswith("SigBlk:")).split()[1], 16)
    with open(f"/proc/self/task/{tid}/comm") as comm:
        name = comm.read().strip()
    taken = [s.name for s in asked if not blocked & (1 << (s - 1))]
    print(f"rank {os.environ['RANK']} thread {name} main={tid == main} takes {taken}", flush=True)
"""


@pytest.mark.parametrize("preload", [True, False])
def test_threads_started_before_the_program_leave_its_signals_to_the_main_thread(
        runner: Runner, preload: bool) -> None:
    """Rank 0's store server thread and torch's import-time threads (started by the bootstrap
    before the script, with ``--no-preload``) block the signals a program handles: a signal
    the kernel hands to such a thread runs the program's handler only when the main thread
    next runs Python code, so a main thread waiting in ``select`` slept through it."""
    runner.script("masks.py", _THREAD_MASKS)
    result = runner.run(["-n", "2", *([] if preload else ["--no-preload"]), "masks.py"])
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if " thread " in line]
    assert any("pt_tcpstore_uv" in line for line in lines), lines  # the case that matters
    for line in lines:
        expected = "['SIGINT', 'SIGTERM', 'SIGHUP', 'SIGUSR1', 'SIGUSR2']" if "main=True" in line \
            else "[]"
        assert line.endswith(f"takes {expected}"), lines


def test_sigint_stops_workers_with_130(runner: Runner) -> None:
    runner.script("sleeper.py", """
import os, threading
print(f"ready {os.environ['RANK']}", flush=True)
threading.Event().wait(100)
""")
    proc = runner.start(["-n", "2", "sleeper.py"])
    assert proc.stdout is not None
    runner.read_lines(proc.stdout, 2, contains="ready")
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=runner.timeout)
    assert proc.returncode == 130, err.decode()
    assert "got SIGINT: forwarded to the workers" in err.decode()
    assert "KeyboardInterrupt" in err.decode()


def test_sigkill_of_the_parent_leaves_no_orphans(runner: Runner) -> None:
    runner.script("sleeper.py", """
import os, threading
print(f"ready {os.environ['RANK']} {os.getpid()}", flush=True)
threading.Event().wait(100)
""")
    proc = runner.start(["-n", "2", "sleeper.py"])
    assert proc.stdout is not None
    lines = runner.read_lines(proc.stdout, 2, contains="ready")
    pids = [int(line.split()[2]) for line in lines if line.startswith("ready")]
    assert len(pids) == 2
    proc.kill()
    proc.communicate(timeout=runner.timeout)
    assert runner.wait_gone(pids, timeout=30) == []


def test_children_of_workers_are_killed_too(runner: Runner) -> None:
    runner.script("spawner.py", _MEET + """
import subprocess
child = subprocess.Popen([sys.executable, "-c",
                          "import threading; threading.Event().wait(100)", "grandchild-mark"])
print(f"child {child.pid}", flush=True)
dist.barrier()
if rank == 1:
    raise SystemExit(4)
""" + _HANG)
    result = runner.run(["-n", "2", "spawner.py"])
    assert result.returncode == 4, result.stderr
    children = [int(pid) for pid in re.findall(r"child (\d+)", result.stdout)]
    assert len(children) == 2
    assert runner.wait_gone(children, mark=b"grandchild-mark") == []


def test_tag_output_prefixes_every_line(runner: Runner) -> None:
    runner.script("talk.py", """
import os, sys
r = os.environ["RANK"]
print(f"out line A of {r}")
print(f"out line B of {r}")
print(f"err line of {r}", file=sys.stderr)
sys.stdout.write("no newline at the end")
""")
    result = runner.run(["-n", "2", "--tag-output", "talk.py"])
    assert result.returncode == 0, result.stderr
    for r in (0, 1):
        assert f"[rank{r}]:out line A of {r}\n" in result.stdout
        assert f"[rank{r}]:out line B of {r}\n" in result.stdout
        assert f"[rank{r}]:err line of {r}\n" in result.stderr
        assert f"[rank{r}]:no newline at the end\n" in result.stdout
    assert all(line.startswith("[rank") for line in result.stdout.splitlines())


# The worker exits 79 (saved, to be requeued) after two SIGTERMs.
_TWO_TERMS = SIGNAL_WAIT + """
import os, signal, sys
on_signals(signal.SIGTERM)
rank = os.environ["RANK"]
print(f"ready {rank}", flush=True)
for count in (1, 2):
    if next_signal(60) is None:
        sys.exit(5)
    print(f"rank {rank} got SIGTERM {count}", flush=True)
sys.exit(79)
"""

#: one task of a one-node Slurm step (job 5), as srun gives it
_SLURM_STEP = {
    "SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0", "SLURM_NTASKS": "1", "SLURM_NNODES": "1",
    "SLURM_JOB_NODELIST": "localhost", "SLURM_STEP_NODELIST": "localhost",
    "SLURMD_NODENAME": "localhost", "SLURM_TASKS_PER_NODE": "1", "SLURM_STEP_NUM_TASKS": "1",
    "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_TASKS_PER_NODE": "1",
}


@pytest.mark.parametrize("preload", [True, False])
def test_under_slurm_sigterm_is_forwarded_without_a_deadline_or_a_kill_on_repeat(
    runner: Runner, preload: bool,
) -> None:
    """Slurm sends SIGTERM to every process of the step (srun passes on its own as well) and
    SIGKILL after KillWait: ``unirank run`` forwards each SIGTERM and kills nothing itself, so
    that workers saving a checkpoint finish it; they exit 79 and the run says so in one line."""
    runner.script("two_terms.py", _TWO_TERMS)
    proc = runner.start(["-n", "2", *([] if preload else ["--no-preload"]), "two_terms.py"],
                        env=_SLURM_STEP)
    assert proc.stdout is not None
    runner.read_lines(proc.stdout, 2, contains="ready")
    proc.send_signal(signal.SIGTERM)
    runner.read_lines(proc.stdout, 2, contains="got SIGTERM 1")
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=runner.timeout)
    assert proc.returncode == 79, err.decode()
    assert err.decode().strip().splitlines() == [
        "unirank run: stopped to be requeued (exit code 79): ranks 0-1 saved and stopped so "
        "that the run goes on later; not a failure"], err.decode()
