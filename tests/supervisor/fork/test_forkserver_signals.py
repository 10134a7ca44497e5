"""The fork server outlives the signals a batch system sends to every process of a job step
(``scancel --signal=USR2``, a time limit's SIGTERM), and its workers get the signal dispositions
of a fresh interpreter back. Real ``unirank run``, real processes, real signals."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time

import pytest

from _procs import Runner, is_live, read_stdout_until

pytestmark = pytest.mark.integration

TIMEOUT = 120.0

# each worker says who its parent is and how its signals are set, then waits for stdin's end
_WORKER = """
import os, signal, sys
names = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP")
default = all(signal.getsignal(getattr(signal, n)) == signal.SIG_DFL for n in names)
interrupt = signal.getsignal(signal.SIGINT) is signal.default_int_handler
print(f"READY {os.environ['RANK']} {os.getppid()} {default} {interrupt}", flush=True)
sys.stdin.read()
"""


def _settled_state(pid: int) -> str:
    """The state of ``pid`` once it stopped (T) or died (Z, or "gone"); fails after TIMEOUT."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return "gone"
        if state in ("T", "t", "Z", "X"):
            return "T" if state in ("T", "t") else "Z"
        select.select([], [], [], 0.01)  # a stop or a death takes a scheduling slice
    raise AssertionError(f"pid {pid} neither stopped nor died in {TIMEOUT:g} s")


def _ready_lines(proc: subprocess.Popen[bytes], count: int) -> list[list[str]]:
    """The first ``count`` READY lines of ``proc``'s stdout, split; fails after TIMEOUT."""
    seen = read_stdout_until(
        proc, lambda seen: seen.count(b"READY ") >= count and seen.endswith(b"\n"), TIMEOUT,
        f"{count} READY lines")
    return [line.split()[1:] for line in seen.decode().splitlines() if line.startswith("READY ")]


def test_the_server_outlives_a_step_s_signals_and_workers_get_default_dispositions(
        runner: Runner) -> None:
    script = runner.script("wait.py", _WORKER)
    proc = runner.start(["-n", "2", str(script)], stdin=subprocess.PIPE)
    try:
        lines = _ready_lines(proc, 2)
        servers = {ppid for _rank, ppid, _default, _interrupt in lines}
        assert len(servers) == 1 and int(next(iter(servers))) != proc.pid, lines
        assert all(d == "True" and i == "True" for _r, _p, d, i in lines), lines
        server = int(next(iter(servers)))
        for signum in (signal.SIGTERM, signal.SIGUSR2, signal.SIGUSR1, signal.SIGINT,
                       signal.SIGHUP):
            os.kill(server, signum)  # what a step-wide signal does to the server
        # a process a signal kills never stops: one that stops survived the signals before
        os.kill(server, signal.SIGSTOP)
        assert _settled_state(server) == "T", "the fork server died of a step's signal"
        os.kill(server, signal.SIGCONT)
        assert is_live(server, b"unirank.supervisor.fork.server")
        _out, err = proc.communicate(b"", timeout=TIMEOUT)  # stdin ends: so do the workers
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err.decode()


# each worker says how SIGINT and SIGTSTP are set, then sleeps; an interrupt runs its finally
_SLEEPER = """
import os, signal, sys, time
interrupt = signal.getsignal(signal.SIGINT) is signal.default_int_handler
tstp_ignored = signal.getsignal(signal.SIGTSTP) == signal.SIG_IGN
try:  # entered before READY: the signal may come as soon as READY is out
    print(f"READY {os.environ['RANK']} {interrupt} {tstp_ignored}", flush=True)
    time.sleep(120)
except KeyboardInterrupt:
    print(f"INTERRUPTED {os.environ['RANK']}", flush=True)
    raise
finally:
    print(f"FINALLY {os.environ['RANK']}", flush=True)
"""


def _as_a_background_job() -> None:
    """What a non-interactive shell does to a command started with ``&`` (SIGINT and SIGQUIT
    ignored), and a signal ``unirank run`` neither forwards nor touches (SIGTSTP) ignored too.
    SIGQUIT is one of torchrun's forwarded signals, so the supervisor catches it and a worker
    gets its default, as an exec'ed child would."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    signal.signal(signal.SIGTSTP, signal.SIG_IGN)


@pytest.mark.parametrize("preload", [True, False], ids=["forked", "no-preload"])
def test_ctrl_c_reaches_workers_of_a_run_started_in_the_background(
        runner: Runner, preload: bool) -> None:
    """``setsid unirank run ... &`` from a script: SIGINT and SIGQUIT come ignored. The workers
    get what a child the supervisor exec'ed gets (SIGINT, which the supervisor catches, raises
    KeyboardInterrupt; SIGTSTP, which it leaves ignored, stays ignored), so a SIGINT to the
    group ends them with KeyboardInterrupt, their ``finally`` run, instead of SIGKILL after the
    grace."""
    script = runner.script("sleep.py", _SLEEPER)
    env = runner.environ(None if preload else {"UNIRANK_NO_PRELOAD": "1"})
    proc = subprocess.Popen(runner.command(["-n", "2", str(script)]), cwd=runner.cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, preexec_fn=_as_a_background_job,
                            start_new_session=True)
    try:
        lines = _ready_lines(proc, 2)
        assert sorted(lines) == [["0", "True", "True"], ["1", "True", "True"]], lines
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    text = out.decode()
    assert proc.returncode == 130, err.decode()
    for rank in (0, 1):
        assert f"INTERRUPTED {rank}" in text and f"FINALLY {rank}" in text, (text, err)
    assert "killed by SIGKILL" not in err.decode(), err.decode()
