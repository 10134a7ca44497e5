"""Helper processes started one way (:func:`unirank.supervisor.helper.start_helper`): the
run's environment and nothing else, a session of their own, :data:`unirank.signals.SHIELDED`
ignored from their first instruction on, and death with their parent. Real processes: a probe
module in the test's folder is started as the helper."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

from _procs import read_stdout_until, wait_gone
from unirank.signals import SHIELDED
from unirank.supervisor.helper import start_helper

#: what a helper says about itself, then it waits for its stdin to end
PROBE = """
import ctypes, json, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
death = ctypes.c_int(0)
libc.prctl(2, ctypes.byref(death), 0, 0, 0)  # PR_GET_PDEATHSIG
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
print(json.dumps({
    "env": dict(os.environ), "session": os.getsid(0) == os.getpid(), "death": death.value,
    "ignored": int(status["SigIgn"].strip(), 16), "blocked": int(status["SigBlk"].strip(), 16),
    "argv": sys.argv[1:],
}), flush=True)
sys.stdin.read()
"""

#: ``python -c``: start the probe as a helper, print its pid, then wait to be killed
PARENT = """
import os, subprocess, sys
from unirank.supervisor.helper import start_helper
proc = start_helper("probe_helper", [], dict(os.environ), stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE)
print(proc.pid, flush=True)
proc.stdout.readline()
print("ready", flush=True)
sys.stdin.read()
"""


def _mask(signals: tuple[int, ...]) -> int:
    return sum(1 << (int(s) - 1) for s in signals)


def _environ(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "probe_helper.py").write_text(PROBE)
    src = str(Path(__file__).resolve().parents[2] / "src")
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path), src]), "ONLY_THIS": "1"}


def test_a_helper_gets_the_run_s_environment_its_session_the_shield_and_death_with_parent(
        tmp_path: Path) -> None:
    environ = _environ(tmp_path)
    proc = start_helper("probe_helper", ["a", "b c"], environ, stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE)
    out, _ = proc.communicate(b"", timeout=60)
    assert proc.returncode == 0
    seen = json.loads(out)
    # exactly the mapping given (Python adds nothing but LC_CTYPE coercion, off here)
    assert {k: v for k, v in seen["env"].items() if k != "LC_CTYPE"} == environ
    assert seen["session"] is True
    assert seen["death"] == signal.SIGKILL
    assert seen["ignored"] & _mask(SHIELDED) == _mask(SHIELDED)
    assert seen["blocked"] & _mask(SHIELDED) == 0  # unblocked again once ignored
    assert seen["argv"] == ["a", "b c"]
    # and this process's own mask is as it was
    assert not signal.pthread_sigmask(signal.SIG_BLOCK, []) & set(SHIELDED)


def test_signals_sent_from_the_first_moment_never_kill_a_helper(tmp_path: Path) -> None:
    """USR1, USR2, TERM, INT and HUP sent again and again from the moment the helper's pid is
    known (before its interpreter has started): it ends only when its stdin ends, with 0."""
    proc = start_helper("probe_helper", [], _environ(tmp_path), stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE)
    assert proc.stdout is not None
    sent = 0
    while proc.poll() is None and sent < 20000:
        for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT,
                       signal.SIGHUP):
            os.kill(proc.pid, signum)
            sent += 1
        if select.select([proc.stdout], [], [], 0)[0]:  # it has started and said so
            break
    out, _ = proc.communicate(b"", timeout=60)
    assert proc.returncode == 0, (proc.returncode, sent)
    assert json.loads(out)["session"] is True


def test_a_helper_dies_with_its_parent(tmp_path: Path) -> None:
    environ = _environ(tmp_path)
    parent = subprocess.Popen([sys.executable, "-c", PARENT], env=environ,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        seen = read_stdout_until(parent, lambda b: b"ready" in b, 60, "the helper's start")
        helper = int(seen.split()[0])
        parent.kill()
        parent.wait(timeout=60)
        assert wait_gone([helper], timeout=30) == []
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.communicate(timeout=60)
