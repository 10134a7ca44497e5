"""Exit codes, stderr tails, traceback excerpts and the failure summary (pure)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from unirank.supervisor.deathcause import OomVerdict
from unirank.supervisor.summary import (
    OutputTail,
    RunResult,
    WorkerExit,
    describe_returncode,
    exit_code_of,
    format_summary,
    traceback_excerpt,
)

TRACE = [
    "some log line",
    "Traceback (most recent call last):",
    '  File "train.py", line 3, in <module>',
    "    main()",
    "ValueError: bad batch",
]


def test_exit_codes() -> None:
    assert exit_code_of(0) == 0
    assert exit_code_of(3) == 3
    assert exit_code_of(-9) == 137
    assert exit_code_of(-15) == 143
    assert describe_returncode(2) == "exit code 2"
    assert describe_returncode(-11) == "killed by SIGSEGV (signal 11)"


def test_tail_keeps_the_end_and_drops_a_cut_line() -> None:
    tail = OutputTail(limit=16)
    tail.feed(b"first line\nsecond\n")
    tail.feed(b"third\n")
    assert tail.lines() == ["second", "third"]
    whole = OutputTail()
    whole.feed(b"a\nb")
    assert whole.lines() == ["a", "b"]


def test_excerpt_starts_at_the_last_traceback() -> None:
    lines = ["Traceback (most recent call last):", "old", *TRACE, "", ""]
    assert traceback_excerpt(lines) == TRACE[1:]
    assert traceback_excerpt(["x"] * 30 + ["last"], max_lines=3) == ["x", "x", "last"]
    long = ["Traceback (most recent call last):", *[f"  frame {i}" for i in range(40)], "E: e"]
    short = traceback_excerpt(long, max_lines=5)
    assert short == ["Traceback (most recent call last):", "  ...", "  frame 38", "  frame 39",
                     "E: e"]
    # torch prefixes its ranks' tracebacks with "[rankN]: "
    tagged = ["[rank1]: Traceback (most recent call last):", "[rank1]: KeyError: 'x'"]
    assert traceback_excerpt(["noise", *tagged]) == tagged


def test_summary_names_rank_node_code_and_traceback() -> None:
    failed = WorkerExit(rank=5, local_rank=1, node="gpu07", returncode=1, stderr_tail=tuple(TRACE))
    result = RunResult(
        exits=(WorkerExit(4, 0, "gpu07", -15), failed, WorkerExit(6, 2, "gpu07", -15),
               WorkerExit(7, 3, "gpu07", 0)),
        first_failure=failed,
    )
    assert result.exit_code == 1
    text = format_summary(result)
    first, *rest = text.splitlines()
    assert first == ("unirank run: FAILED (exit code 1): rank 5 (local rank 1) on node gpu07: "
                     "exit code 1")
    assert "    | ValueError: bad batch" in rest
    assert "    | some log line" not in rest
    assert rest[-1] == ("  other workers: ranks 4, 6: killed by SIGTERM (signal 15); "
                        "rank 7: ok")


def test_success_has_no_summary() -> None:
    assert format_summary(RunResult(exits=(WorkerExit(0, 0, "n", 0),))) == ""


def test_stop_signal_gives_128_plus_signal() -> None:
    result = RunResult(exits=(WorkerExit(0, 0, "n", -2), WorkerExit(1, 1, "n", 0)),
                       stop_signal=2)
    assert result.exit_code == 130
    assert format_summary(result).startswith("unirank run: stopped by SIGINT (exit code 130)")
    handled = RunResult(exits=(WorkerExit(0, 0, "n", 0),), stop_signal=15)
    assert handled.exit_code == 143  # saved and ended 0, but stopped: not done
    assert format_summary(handled).startswith("unirank run: stopped by SIGTERM (exit code 143)")
    requeued = RunResult(exits=(WorkerExit(0, 0, "n", 79),), stop_signal=15)
    assert requeued.exit_code == 79


def test_signal_death_is_the_first_failure_s_code() -> None:
    dead = WorkerExit(1, 1, "n", -9)
    result = RunResult(exits=(WorkerExit(0, 0, "n", -15), dead), first_failure=dead)
    assert result.exit_code == 137
    assert "killed by SIGKILL (signal 9)" in format_summary(result)
    assert "rank 1 wrote nothing to stderr" in format_summary(result)



GOLDEN = Path(__file__).resolve().parent.parent / "fixtures" / "summary"
OOM = OomVerdict(True, "its cgroup's memory.events", "/sys/fs/cgroup/job1/task_1",
                 "memory.max", "/sys/fs/cgroup/job1", 200 << 20)
SEGV_STACK = ("Fatal Python error: Segmentation fault",
              "Current thread 0x00007fa6dfe72b80 (most recent call first):",
              '  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at',
              '  File "/tmp/job/train.py", line 6 in crash',
              '  File "/tmp/job/train.py", line 10 in <module>')
#: how each rank 1 died, in a run of 3 whose other ranks the teardown stopped
DEATHS = {
    "oom": WorkerExit(1, 1, "node1", -9, oom=OOM, peak_memory=198 << 20),
    "oom_no_limit": WorkerExit(1, 1, "node1", -9, peak_memory=23 << 30, oom=OomVerdict(
        True, "its cgroup's memory.events", "/sys/fs/cgroup/job1/task_1")),
    "oom_kernel_log": WorkerExit(1, 1, "node1", -9, oom=OomVerdict(True, "the kernel log")),
    "kill9": WorkerExit(1, 1, "node1", -9, peak_memory=40 << 20, oom=OomVerdict(
        False, "its cgroup's memory.oom_control", "/sys/fs/cgroup/memory/a")),
    "kill9_unknown": WorkerExit(1, 1, "node1", -9),
    "segv": WorkerExit(1, 1, "node1", -11, fault_stack=SEGV_STACK,
                       stderr_tail=("loading shard 3", *SEGV_STACK[:2])),
    # an exception: its error line, as a SystemExit's, though the excerpt ends with it too
    "raised": WorkerExit(1, 1, "node1", 1, stderr_tail=tuple(TRACE), error="ValueError: bad batch",
                         recorded_exit_code=1),
    "exited": WorkerExit(1, 1, "node1", 3, stderr_tail=("bad batch",),
                         error="SystemExit: bad batch", recorded_exit_code=3),
    # --redirects: the quoted stderr says which file holds it
    "redirected": WorkerExit(1, 1, "node1", 1, stderr_tail=tuple(TRACE),
                             error="ValueError: bad batch", recorded_exit_code=1,
                             stderr_file="/runs/r1/attempt_0/1/stderr.log"),
}


def death_summary(name: str) -> str:
    """The failure summary of a run whose rank 1 died as ``DEATHS[name]`` says."""
    others = (WorkerExit(0, 0, "node1", -15, stopped=True),
              WorkerExit(2, 2, "node1", -9, stopped=True, oom=OOM))
    dead = DEATHS[name]
    return format_summary(RunResult(exits=(others[0], dead, others[1]), first_failure=dead))


@pytest.mark.parametrize("name", sorted(DEATHS))
def test_why_a_worker_died_reads_as_the_golden_file(name: str) -> None:
    """The OOM killer named with its cgroup, limit and peak memory; a plain SIGKILL not; a
    fault's Python stack apart from the stderr before it; an exception's error line; the file
    of a redirected stderr. ``UNIRANK_REGEN_GOLDEN=1`` writes the files."""
    path = GOLDEN / f"{name}.txt"
    text = death_summary(name)
    if os.environ.get("UNIRANK_REGEN_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with UNIRANK_REGEN_GOLDEN=1"
    assert text == path.read_text()


def test_a_forwarded_stop_lists_the_workers_with_no_other_before_them() -> None:
    """Ctrl-C forwarded to the workers, which saved and ended 0: no worker failed first, so
    the list is of the workers, not of "other" ones (``forwarded_stop.txt``;
    ``UNIRANK_REGEN_GOLDEN=1`` writes it)."""
    result = RunResult(exits=(WorkerExit(0, 0, "node1", 0), WorkerExit(1, 1, "node1", 0),
                              WorkerExit(2, 2, "node1", -15, stopped=True)),
                       stop_signal=int(signal.SIGINT))
    path, text = GOLDEN / "forwarded_stop.txt", format_summary(result)
    if os.environ.get("UNIRANK_REGEN_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text()
    assert "other" not in text


def test_a_world_change_names_the_node_and_fails_only_if_workers_did() -> None:
    lost = "node n2 (10.0.0.2) is lost: no beat for 5 s"
    stopped = RunResult(exits=(WorkerExit(0, 0, "n1", -15, stopped=True),
                               WorkerExit(1, 1, "n1", -15, stopped=True)), world_changed=lost)
    assert stopped.exit_code == 1
    first, other = format_summary(stopped).splitlines()
    assert first == f"unirank run: FAILED (exit code 1): {lost}"
    assert other == "  workers: ranks 0-1: killed by SIGTERM (signal 15), stopped by " \
        "the teardown"
    done = RunResult(exits=(WorkerExit(0, 0, "n1", 0),), world_changed=lost)
    assert done.exit_code == 0
    after = RunResult(exits=(WorkerExit(0, 0, "n1", 0),), attempts=(stopped,))
    assert format_summary(after).splitlines() == [
        "unirank run: succeeded after 1 restart", f"  attempt 0: {lost}"]


def test_a_worker_killed_by_a_signal_was_killed_not_ended_with_it() -> None:
    from unirank.supervisor.summary import describe_end, ended

    assert ended(describe_end(-11)) == "was killed by SIGSEGV (signal 11)"
    assert ended(describe_end(3)) == "ended with exit code 3"


UNEVEN_ERROR = ("unirank: the ranks ran different numbers of collectives: rank 1 ended its "
                "program after collective #2, rank 0 called all_reduce #3 (float32[4])")
UNEVEN_TRACE = (*TRACE[1:4], "RuntimeError: Connection closed by peer [127.0.0.1]:39333. This "
                "is typically caused by a remote worker crashing.", UNEVEN_ERROR)


def test_a_rank_that_ran_fewer_collectives_is_not_called_ok() -> None:
    """Issue 34 item 5: rank 1 skipped a collective and ended 0, rank 0 failed on the closed
    connection: the error line is the uneven line (though the excerpt ends with it too) and
    rank 1 is named as having ended after fewer collectives, not ``ok``. Golden file
    ``uneven.txt`` (``UNIRANK_REGEN_GOLDEN=1`` writes it)."""
    failed = WorkerExit(0, 0, "node1", 1, stderr_tail=UNEVEN_TRACE, error=UNEVEN_ERROR,
                        recorded_exit_code=1)
    text = format_summary(RunResult(exits=(failed, WorkerExit(1, 1, "node1", 0),
                                           WorkerExit(2, 2, "node1", 0)), first_failure=failed))
    path = GOLDEN / "uneven.txt"
    if os.environ.get("UNIRANK_REGEN_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text()
    assert f"  error: {UNEVEN_ERROR}\n" in text
    assert ("  other workers: rank 1: ended 0 after collective #2, fewer than rank 0; "
            "rank 2: ok\n") in text
