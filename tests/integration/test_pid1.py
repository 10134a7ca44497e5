"""``unirank run`` as PID 1 of a container, simulated with ``unshare --pid --fork --mount-proc``
(a PID namespace of its own, as a pod's container has; needs root): the SIGTERM a pod's stop
sends reaches the ranks, which save within the grace period (``ur.stop_requested()``); an
orphan re-parented to PID 1 is reaped (no zombie); the exit code is non-zero, as torchrun's
under the same test (torchrun's is 1, a SignalException traceback; unirank's is 143, 128 +
SIGTERM), so a Kubernetes Job does not count the stopped pod as done."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import shutil
import signal
import subprocess
import sys
import termios
from collections.abc import Sequence
from pathlib import Path

import pytest

from _procs import launcher_free_environ, read_lines, unavailable

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parent / "scripts" / "pid1_job.py"
#: --kill-child: a test that gives up (kills unshare) ends the namespace too, leaving nothing
UNSHARE = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]
TIMEOUT = 120.0


def _need_unshare() -> None:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        unavailable("unshare --pid needs util-linux's unshare and root")


def pid1_of(unshare_pid: int) -> int:
    """The pid (here) of the namespace's PID 1: unshare's only child."""
    children: list[int] = []
    for task in os.listdir(f"/proc/{unshare_pid}/task"):
        text = Path(f"/proc/{unshare_pid}/task/{task}/children").read_text()
        children += [int(pid) for pid in text.split()]
    assert len(children) == 1, children
    return children[0]


def stop_as_a_pod(command: Sequence[str], tmp_path: Path,
                  ready_lines: int = 2) -> tuple[int, str]:
    """Run ``command`` as PID 1 of a new PID namespace; once every rank said READY, send its
    PID 1 SIGTERM (as the kubelet does at a pod's stop); its exit code and its output."""
    proc = subprocess.Popen([*UNSHARE, *command], cwd=tmp_path, env=launcher_free_environ(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        seen = read_lines(proc.stdout, ready_lines, contains="READY", timeout=TIMEOUT)
        os.kill(pid1_of(proc.pid), signal.SIGTERM)
        rest = proc.communicate(timeout=TIMEOUT)[0].decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, "\n".join(seen) + "\n" + rest


def test_unirank_run_as_pid1_saves_reaps_and_exits_143(tmp_path: Path) -> None:
    _need_unshare()
    code, out = stop_as_a_pod([sys.executable, "-m", "unirank", "run", "-n", "2", str(SCRIPT),
                               str(tmp_path), "--orphan"], tmp_path)
    assert "ORPHAN reaped" in out, out
    assert sorted(p.name for p in tmp_path.glob("ckpt.*")) == ["ckpt.0", "ckpt.1"], out
    assert "unirank run: got SIGTERM: forwarded to the workers" in out, out
    assert code == 143, out
    assert "unirank run: stopped by SIGTERM (exit code 143)" in out, out


def test_torchrun_as_pid1_under_the_same_stop_exits_non_zero(tmp_path: Path) -> None:
    """The reference: torchrun forwards the SIGTERM too (its workers save) and exits 1."""
    _need_unshare()
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or \
        shutil.which("torchrun")
    assert torchrun, "torchrun comes with torch"
    code, out = stop_as_a_pod([torchrun, "--standalone", "--nproc-per-node", "2", str(SCRIPT),
                               str(tmp_path)], tmp_path)
    assert sorted(p.name for p in tmp_path.glob("ckpt.*")) == ["ckpt.0", "ckpt.1"], out
    assert code == 1 and "SignalException" in out, out


def test_ctrl_c_on_a_terminal_reaches_the_ranks_once(tmp_path: Path) -> None:
    """``docker run -it``: PID 1 on a terminal whose Ctrl-C goes to the foreground process
    group. ``unirank run`` takes the foreground for itself, so the SIGINT reaches it once
    (twice, from the terminal and forwarded by PID 1, would kill the ranks at once): the ranks
    save, and the exit code is 130."""
    _need_unshare()
    master, slave = pty.openpty()

    def controlling_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    command = [*UNSHARE, sys.executable, "-m", "unirank", "run", "-n", "2", str(SCRIPT),
               str(tmp_path), "--stop-on-int", "--slow-save"]
    proc = subprocess.Popen(command, cwd=tmp_path, env=launcher_free_environ(), stdin=slave,
                            stdout=slave, stderr=slave, preexec_fn=controlling_terminal)
    os.close(slave)
    try:
        with os.fdopen(master, "rb", buffering=0) as terminal:
            seen = read_lines(terminal, 2, contains="READY", timeout=TIMEOUT)
            os.write(terminal.fileno(), b"\x03")  # Ctrl-C
            rest = b""
            with contextlib.suppress(OSError):  # EIO once every writer has gone
                while chunk := os.read(terminal.fileno(), 65536):
                    rest += chunk
        code = proc.wait(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "\n".join(seen) + "\n" + rest.decode(errors="replace")
    assert sorted(p.name for p in tmp_path.glob("ckpt.*")) == ["ckpt.0", "ckpt.1"], out
    assert out.count("got SIGINT") == 1, out
    # not SIGKILLed by a second SIGINT
    assert "\n  workers: ranks 0-1: ok" in out.replace("\r", ""), out
    assert code == 130, out
