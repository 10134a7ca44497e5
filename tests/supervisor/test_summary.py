"""Exit codes, stderr tails, traceback excerpts and the failure summary (pure)."""

from __future__ import annotations

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
    assert handled.exit_code == 0


def test_signal_death_is_the_first_failure_s_code() -> None:
    dead = WorkerExit(1, 1, "n", -9)
    result = RunResult(exits=(WorkerExit(0, 0, "n", -15), dead), first_failure=dead)
    assert result.exit_code == 137
    assert "killed by SIGKILL (signal 9)" in format_summary(result)
    assert "rank 1 wrote nothing to stderr" in format_summary(result)

