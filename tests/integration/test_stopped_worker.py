"""A worker stopped by SIGSTOP (a debugger, Ctrl-Z, an evicted stuck rank) takes the stop
signal ``unirank run`` sends it at once: the supervisor follows it with SIGCONT, so the stop
does not wait for the grace period's SIGKILL.

Environment variables read: the caller's environment, from which launcher variables are removed
(see ``tests/_procs.py``).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from _procs import Runner

pytestmark = pytest.mark.integration

STOPS_ITSELF = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (print("took SIGTERM", flush=True), sys.exit(0)))
print(f"stopping {os.getpid()}", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
time.sleep(600)
"""


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def test_a_stopped_worker_takes_the_stop_signal_before_the_grace_period(
        runner: Runner) -> None:
    runner.script("stops.py", STOPS_ITSELF)
    proc = runner.start(["-n", "1", "--grace-period", "600", "stops.py"], text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("stopping "), line
    pid = int(line.split()[1])
    for _ in range(600):  # until it is stopped (bounded: 60 s)
        if _state(pid) == "T":
            break
        time.sleep(0.1)
    assert _state(pid) == "T"
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=60)  # not the 600 s grace period
    assert "took SIGTERM" in out, out + err
    assert proc.returncode == 128 + signal.SIGTERM, err
