"""The helpers of a real elastic run (``unirank run --nnodes 1:2 --rdzv-backend c10d``: the
fork server and the rendezvous helper) against the signals a terminal and Slurm send: USR1
and USR2 sent to every process of the run (as ``scancel --signal`` does) kill no helper, and a
terminal's Ctrl-C (SIGINT to the run's process group) ends the run with 130 and leaves no
process behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest

from _procs import SIGNAL_WAIT, Runner, free_port, process_tree, read_lines, wait_gone
from unirank.signals import SHIELDED

pytestmark = pytest.mark.integration

#: each worker says it is ready, says which signal it got, and waits
WAITER = SIGNAL_WAIT + """
import os, signal
on_signals(signal.SIGUSR1, signal.SIGUSR2)
print("READY rank", os.environ["RANK"], flush=True)
while True:
    got = signal.Signals(next_signal())
    print(f"got {got.name} rank {os.environ['RANK']}", flush=True)
"""


def _ignored(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("SigIgn:"):
                return int(line.split(":", 1)[1].strip(), 16)
    raise AssertionError(f"no SigIgn for {pid}")


def _helpers(pids: list[int]) -> dict[int, bytes]:
    found = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except OSError:
            continue
        if b"unirank.supervisor.helper" in command:
            found[pid] = command
    return found


def test_usr_signals_to_every_process_kill_no_helper_and_ctrl_c_ends_with_130(
        runner: Runner, tmp_path: Path) -> None:
    runner.script("waiter.py", WAITER)
    args = ["--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
            "--rdzv-conf", "join_timeout=60,last_call_timeout=1", "waiter.py"]
    # in a session of its own, as a terminal's foreground job is in a process group of its own
    proc = subprocess.Popen(runner.command(args), cwd=runner.cwd, env=runner.environ(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        _check(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=120)


def _check(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdout is not None
    Runner.read_lines(proc.stdout, 2, contains="READY")
    tree = process_tree(proc.pid)
    helpers = _helpers(tree)
    assert any(b"rdzv.agent" in c for c in helpers.values()), (tree, helpers)
    shielded = sum(1 << (int(s) - 1) for s in SHIELDED)
    for pid in helpers:
        assert _ignored(pid) & shielded == shielded, helpers[pid]
    for signum in (signal.SIGUSR1, signal.SIGUSR2):
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        # each worker got it (directly, and again forwarded by the supervisor)
        read_lines(proc.stdout, 2, contains=f"got {signum.name}")
    assert all(os.path.exists(f"/proc/{pid}") for pid in helpers)
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err.decode()
    assert "rendezvous helper ended" not in err.decode(), err.decode()
    assert wait_gone(tree, timeout=30) == []
