"""Hangs where a rank went on past the collective the others wait in (issue 34, real ``unirank
run`` jobs under gloo): gloo hands a rank a result for an all_reduce of another shape than its
peer's, and that rank goes on to the next collective while its peer waits for ever. The
report names both places and the earliest mismatch with nodes and lines, ``--hang-timeout``
ends the job with exit code 86, blaming the rank that called the other shape.

The programs synchronise through the collectives and the reports, never through sleeps."""

from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest

from _procs import Runner, read_lines

pytestmark = pytest.mark.integration

SHAPE2 = """import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
for _ in range(3):
    dist.all_reduce(torch.ones(4))
dist.all_reduce(torch.ones(2) if rank == 1 else torch.ones(4))  # the shapes differ
dist.barrier()  # rank 1 waits here
print("done", rank)
"""


def line_of(script: str, marker: str) -> int:
    return next(i for i, line in enumerate(script.splitlines(), 1) if marker in line)


def test_a_rank_ahead_after_another_shape_is_reported_and_timed_out(runner: Runner) -> None:
    runner.script("shape2.py", SHAPE2)
    ended = runner.run(["--hang-report-after", "2", "--hang-timeout", "4", "--grace-period",
                        "1", "-n", "2", "shape2.py"], env={"UNIRANK_HANG_INTERVAL": "0.5"})
    err = ended.stderr
    call, barrier = line_of(SHAPE2, "the shapes differ"), line_of(SHAPE2, "waits here")
    assert re.search(rf"^  rank 0 \((\S+)\) waits in all_reduce #4 \(float32\[4\], "
                     rf"shape2.py:{call}\) since \d+ s; rank 1 \(\1\) has left it: it waits in "
                     rf"barrier #5 \(shape2.py:{barrier}\) since \d+ s$", err, re.M), err
    # rank 1's all_reduce returned at once: its watcher never saw it waiting, nor its line
    assert re.search(rf"^  mismatch: rank 1 \((\S+)\) called all_reduce #4 \(float32\[2\]"
                     rf"(, shape2.py:{call})?\), rank 0 \(\1\) all_reduce #4 \(float32\[4\], "
                     rf"shape2.py:{call}\)$", err, re.M), err
    assert "  ending the job (--hang-timeout 4 s, exit code 86)" in err, err
    assert ended.returncode == 86, err
    # blamed: the rank that called the other shape, and the error line keeps the mismatch
    assert re.search(r"^unirank run: FAILED \(exit code 86\): rank 1 ", err, re.M), err
    assert re.search(r"^  error: HangTimeoutError: no progress for 4 s \(--hang-timeout\): "
                     r"mismatch: rank 1 \(\S+\) called all_reduce #4 \(float32\[2\]", err,
                     re.M), err


def test_ctrl_c_reports_a_rank_ahead(runner: Runner) -> None:
    runner.script("shape2.py", SHAPE2)
    # the ranks wait in collectives that never end: nothing acts on the SIGINT, SIGKILL
    # follows at the grace period's end (1 s here)
    proc = subprocess.Popen(runner.command(["--hang-report-after", "2", "--grace-period", "1",
                                            "-n", "2", "shape2.py"]),
                            cwd=runner.cwd, env=runner.environ({"UNIRANK_HANG_INTERVAL": "0.5"}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        read_lines(proc.stderr, 1, contains="every rank's stack:")  # type: ignore[arg-type]
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal does
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    _, _, after = err.decode().partition("unirank: HANG (on SIGINT): ")
    assert re.search(r"^  rank 0 \(\S+\) waits in all_reduce #4 .* rank 1 \(\S+\) has left it: "
                     r"it waits in barrier #5", after, re.M), err
    assert "  mismatch: rank 1 (" in after, err
    assert proc.returncode == 130, err


SKIP1 = """import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(3):
    if rank == 1 and step == 1:
        continue  # rank 1 skips one all_reduce
    dist.all_reduce(torch.ones(4))
print("done", rank)
"""


def test_a_rank_that_skipped_a_collective_and_ended_is_named(runner: Runner) -> None:
    """Rank 1 ends normally after two all_reduces; rank 0's third fails at once with gloo's
    "Connection closed by peer ... a remote worker crashing": nothing crashed, the summary
    says the ranks ran different numbers of collectives."""
    runner.script("skip1.py", SKIP1)
    ended = runner.run(["-n", "2", "skip1.py"])
    err = ended.stderr
    assert ended.returncode == 1, err
    summary = err[err.index("unirank run: FAILED"):]
    assert ("unirank: the ranks ran different numbers of collectives: rank 1 ended its "
            "program after collective #2, rank 0 called all_reduce #3 (float32[4]") in summary, err
    # the uneven line is the error line, and rank 1 is not called ok
    assert re.search(r"^  error: unirank: the ranks ran different numbers of collectives: rank 1 "
                     r"ended its program after collective #2, rank 0 called all_reduce #3 ",
                     summary, re.M), err
    assert re.search(r"^  other workers: rank 1: ended 0 after collective #2, fewer than rank 0$",
                     summary, re.M), err
    assert "rank 1: ok" not in summary, err


LIB = """import threading


def fetch():
    threading.Event().wait()  # the library blocks (as tqdm's monitor or a queue may)
"""

USES_LIB = """import torch
import torch.distributed as dist

import slowlib

dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
if dist.get_rank() == 1:
    slowlib.fetch()  # the script's line
dist.all_reduce(t)
"""


def test_a_library_on_pythonpath_is_not_the_scripts_line(runner: Runner, tmp_path) -> None:
    """``pip install --target libs`` put on PYTHONPATH: the report names the script's line
    that called into it, not the library's."""
    libs = tmp_path / "libs"
    (libs / "slowlib").mkdir(parents=True)
    (libs / "slowlib-1.0.dist-info").mkdir()
    (libs / "slowlib" / "__init__.py").write_text(LIB)
    runner.script("uses_lib.py", USES_LIB)
    pythonpath = os.pathsep.join([str(libs), os.environ.get("PYTHONPATH", "")])
    ended = runner.run(["--hang-report-after", "2", "--hang-timeout", "4", "--grace-period",
                        "1", "-n", "2", "uses_lib.py"],
                       env={"UNIRANK_HANG_INTERVAL": "0.5", "PYTHONPATH": pythonpath})
    err = ended.stderr
    assert re.search(r"rank 1 \(\S+\) has not entered it: its main thread is in <module> "
                     rf"\(uses_lib.py:{line_of(USES_LIB, 'the script')}\)$", err, re.M), err
