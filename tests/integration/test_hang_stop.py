"""The hang report when the job is stopped (real ``unirank run`` and torchrun jobs, gloo): a
terminal's Ctrl-C (SIGINT to the launcher's process group) or a scheduler's SIGTERM (to the
launcher) while ranks wait in a collective another rank has not entered prints the report
before the signal is forwarded (and where their calls do not match, the ranks that wait are
ended without the grace period); a Ctrl-C while no rank waits prints none; torch's own
collective timeout (``init_process_group(timeout=4 s)``) leaves the report, once, and the
hang in the failure summary's ``error:`` line.

The scripts synchronise through a FIFO and the periodic report, never through sleeps."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from _procs import Runner, free_port, read_lines

pytestmark = pytest.mark.integration

#: the periodic report is the test's sign that every rank is in place
FAST = ["--hang-report-after", "2", "--grace-period", "1"]

SKIP = """import os
import pathlib

import torch
import torch.distributed as dist


def idle_after_skipping():
    pathlib.Path(os.environ["RELEASE_FILE"]).read_text()  # a FIFO nobody writes to


dist.init_process_group("gloo")
t = torch.ones(1024)
dist.all_reduce(t)
if dist.get_rank() == 1:
    idle_after_skipping()
dist.all_reduce(t)  # the all_reduce rank 1 is late for
"""

COMPUTING = """import os
import pathlib

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
os.write(1, b"ready\\n")
pathlib.Path(os.environ["RELEASE_FILE"]).read_text()  # every rank: no collective waits
"""

MISMATCH = """import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1024)
dist.all_reduce(t)
if dist.get_rank() == 0:
    dist.all_reduce(t)  # the others call another collective: none of them returns
else:
    dist.broadcast(torch.ones(8), src=0)
"""

TIMEOUT = """import threading

import torch
import torch.distributed as dist
import unirank as ur


def load_next_batch():
    threading.Event().wait()  # blocks forever


ur.init("gloo", timeout=4)  # also the group's collective timeout
t = torch.ones(8)
dist.all_reduce(t)
if dist.get_rank() == 1:
    load_next_batch()
dist.all_reduce(t)  # times out in ranks 0 and 2
"""


def line_of(script: str, marker: str) -> int:
    return next(i for i, line in enumerate(script.splitlines(), 1) if marker in line)


def _wavefront(head: str, script: str = SKIP, file: str = "skip.py") -> re.Pattern[str]:
    late = line_of(script, "late for") if script is SKIP else line_of(script, "times out")
    where = ("idle_after_skipping" if script is SKIP else "load_next_batch")
    at = line_of(script, "nobody writes") if script is SKIP else line_of(script, "forever")
    return re.compile(rf"^{head}ranks 0, 2 \((\S+)\) wait in all_reduce #2 \(float32\["
                      rf"{1024 if script is SKIP else 8}\], {file}:{late}\) since \d+ s; rank 1 "
                      rf"\(\1\) has not entered it: its main thread is in {where} "
                      rf"\({file}:{at}\)$", re.M)


def _start(runner: Runner, tmp_path: Path, script: str, name: str,
           options: tuple[str, ...] = tuple(FAST)) -> subprocess.Popen[bytes]:
    """``unirank run -n 3`` in a session of its own (a terminal's process group)."""
    runner.script(name, script)
    release = tmp_path / "release"
    os.mkfifo(release)
    return subprocess.Popen(runner.command([*options, "-n", "3", name]), cwd=runner.cwd,
                            env=runner.environ({"RELEASE_FILE": str(release),
                                                "UNIRANK_HANG_INTERVAL": "0.5"}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def _finish(proc: subprocess.Popen[bytes]) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return out.decode(), err.decode()


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_a_stop_signal_while_ranks_wait_prints_the_report_first(
        runner: Runner, tmp_path: Path, how: str) -> None:
    proc = _start(runner, tmp_path, SKIP, "skip.py")
    try:
        lines = read_lines(proc.stderr, 1, contains="every rank's stack:")  # type: ignore[arg-type]
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # as a terminal does
        else:
            os.kill(proc.pid, signal.SIGTERM)  # as a scheduler does
    finally:
        _, rest = _finish(proc)
    err = "\n".join(lines) + "\n" + rest
    name = "SIGINT" if how == "ctrl-c" else "SIGTERM"
    _, _, after = rest.partition(f"unirank: HANG (on {name}): ranks have waited in a "
                                    "collective for ")
    assert after, err
    assert _wavefront("  ").search(after), err
    assert f'skip.py", line {line_of(SKIP, "nobody writes")}, in idle_after_skipping' in after
    # the report comes before the signal is forwarded
    assert f"got {name}: forwarded to the workers" in after, err
    assert proc.returncode == 128 + (2 if how == "ctrl-c" else 15), err


def test_a_second_ctrl_c_stops_at_once(runner: Runner, tmp_path: Path) -> None:
    """The second SIGINT, while the report is being made, gives it up and kills: the first
    is never forwarded."""
    proc = _start(runner, tmp_path, SKIP, "skip.py")
    try:
        read_lines(proc.stderr, 1, contains="every rank's stack:")  # type: ignore[arg-type]
        os.killpg(proc.pid, signal.SIGINT)
        read_lines(proc.stderr, 1, contains="SIGINT again to stop now")  # type: ignore[arg-type]
        os.killpg(proc.pid, signal.SIGINT)
    finally:
        _, err = _finish(proc)
    assert "forwarded to the workers; SIGKILL" not in err, err
    assert "unirank run: stopped by SIGINT (exit code 130)" in err, err
    assert "killed by SIGKILL (signal 9), stopped by the teardown" in err, err
    assert proc.returncode == 130, err


def test_a_ctrl_c_on_collectives_that_cannot_return_ends_them_without_the_grace_period(
        runner: Runner, tmp_path: Path) -> None:
    """The ranks called collectives that do not match: SIGINT cannot end them (its handler
    waits for the collective), so after the report they are killed ``LOST_PEER_WAIT``
    seconds after the forward, not after the 30 s grace period (the test's 60 s would see
    the grace period's SIGKILL line instead)."""
    proc = _start(runner, tmp_path, MISMATCH, "mismatch.py", ("--hang-report-after", "2"))
    try:
        read_lines(proc.stderr, 1, contains="every rank's stack:")  # type: ignore[arg-type]
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal does
    finally:
        _, err = _finish(proc)
    assert "mismatch: rank 0 (" in err, err
    assert ("got SIGINT: forwarded to the workers; SIGKILL in 30 s; at 2 s for those waiting "
            "in a collective, which cannot return (SIGINT again to kill now)") in err, err
    for rank in range(3):
        assert re.search(rf"rank {rank} \(local rank {rank}\) on node \S+ waits in a "
                         r"collective that cannot return \(the ranks' calls do not match\): "
                         "SIGKILL now, not after the grace period", err), err
    assert "unirank run: stopped by SIGINT (exit code 130)" in err, err
    assert proc.returncode == 130, err


def test_a_ctrl_c_while_no_rank_waits_prints_no_report(runner: Runner, tmp_path: Path) -> None:
    proc = _start(runner, tmp_path, COMPUTING, "computing.py")
    try:
        read_lines(proc.stdout, 3, contains="ready")  # type: ignore[arg-type]
        os.killpg(proc.pid, signal.SIGINT)
    finally:
        _, err = _finish(proc)
    assert "got SIGINT: forwarded to the workers" in err, err
    # forwarded at once: no rank waits, so no report is even looked for
    assert "looking for ranks that wait" not in err, err
    assert "HANG" not in err, err
    assert proc.returncode == 130, err


def test_torchs_collective_timeout_leaves_the_report_and_the_hang_as_the_error(
        runner: Runner) -> None:
    runner.script("timeout.py", TIMEOUT)
    ended = runner.run(["--hang-report-after", "30", "-n", "3", "timeout.py"],
                       env={"UNIRANK_HANG_INTERVAL": "0.5"})
    err = ended.stderr
    assert err.count("unirank: HANG (a collective failed: RuntimeError): ") == 1, err
    assert _wavefront("  ", TIMEOUT, "timeout.py").search(err), err
    assert f'timeout.py", line {line_of(TIMEOUT, "forever")}, in load_next_batch' in err, err
    assert ended.returncode == 1, err
    assert re.search(r"^unirank run: FAILED \(exit code 1\): rank [02] ", err, re.M), err
    # the root cause's traceback and error record end with the hang (a note)
    assert _wavefront(r"(?:  error: |    \| \[rank[02]\]: )unirank: the ranks hung: ", TIMEOUT,
                      "timeout.py").search(err.split("unirank run: FAILED")[1]), err


def test_torchs_collective_timeout_under_torchrun(runner: Runner) -> None:
    """One task per rank: ``ur.init`` installs the excepthook that makes the report."""
    torchrun = shutil.which("torchrun")
    assert torchrun, "torchrun comes with torch"
    runner.script("timeout.py", TIMEOUT)
    proc = runner.start(command=[torchrun, "--nproc-per-node", "3", "--master-port",
                                 str(free_port()), "timeout.py"],
                        env={"UNIRANK_HANG_INTERVAL": "0.5", "UNIRANK_HANG_REPORT_AFTER": "30"})
    _, err_bytes = proc.communicate(timeout=90)
    err = err_bytes.decode()
    assert err.count("unirank: HANG (a collective failed: RuntimeError): ") == 1, err
    assert _wavefront("  ", TIMEOUT, "timeout.py").search(err), err
    assert re.search(r"^\[rank[02]\]: unirank: the ranks hung: ranks 0, 2", err, re.M), err
    assert proc.returncode == 1, err
