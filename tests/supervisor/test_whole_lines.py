"""Whole lines from workers that share a console, for real: ``unirank run`` with unbuffered
workers (``PYTHONUNBUFFERED=1``, ``python -u``), whose ``print`` writes each of its pieces apart,
and ``\\r`` progress output that must show before its line ends (tqdm's bars on a terminal:
tests/supervisor/test_progress_bars.py)."""

from __future__ import annotations

import os
import re
import selectors
import signal
import sys
import time
from typing import IO, TYPE_CHECKING

import pytest

from _procs import SIGNAL_WAIT

if TYPE_CHECKING:
    from _procs import Runner

pytestmark = pytest.mark.integration

LINES = 300
# Four ranks start printing together (after a gloo barrier); unbuffered, each print below is ten
# writes (its six pieces, the spaces, the newline), so the lines of ranks sharing a stdout would
# be glued together often without whole-line output.
_CHATTER = f"""
import sys
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
for i in range({LINES}):
    print("rank", rank, "line", f"{{i:03d}}", "x" * 40)
    print("rank", rank, "note", f"{{i:03d}}", file=sys.stderr)
dist.destroy_process_group()
"""
_OUT_LINE = re.compile(r"rank (\d) line (\d{3}) x{40}")
_ERR_LINE = re.compile(r"rank (\d) note (\d{3})")


def _assert_whole(text: str, pattern: re.Pattern[str], ranks: int) -> None:
    # (torch 2.9's gloo prints its own "[Gloo] Rank 1 is connected to 3 peer ranks..." lines)
    # (and --no-python's one line saying that its workers are not forked from the fork server)
    lines = [line for line in text.splitlines()
             if not line.startswith(("[Gloo] Rank ", "unirank run: starting workers as"))]
    broken = [line for line in lines if not pattern.fullmatch(line)]
    assert not broken, f"{len(broken)} of {len(lines)} lines not whole, e.g. {broken[:3]}"
    seen = sorted((int(m[1]), int(m[2])) for m in map(pattern.fullmatch, lines) if m)
    assert seen == [(r, i) for r in range(ranks) for i in range(LINES)]


@pytest.mark.parametrize("how", ["PYTHONUNBUFFERED=1", "python -u"])
def test_unbuffered_lines_of_four_ranks_arrive_whole(runner: Runner, how: str) -> None:
    runner.script("chatter.py", _CHATTER)
    if how == "python -u":
        result = runner.run(["-n", "4", "--no-python", sys.executable, "-u", "chatter.py"])
    else:
        result = runner.run(["-n", "4", "chatter.py"], env={"PYTHONUNBUFFERED": "1"})
    assert result.returncode == 0, result.stderr
    _assert_whole(result.stdout, _OUT_LINE, 4)
    _assert_whole(result.stderr, _ERR_LINE, 4)


# Rank 0 draws a progress bar on stderr as tqdm does ("\r" then the bar, no newline) and waits at
# its first step for SIGUSR1 (forwarded by unirank run); then it draws its last two steps and ends
# the line. Rank 1 prints a line at that signal.
_PROGRESS = SIGNAL_WAIT + """
import os, signal, sys
on_signals(signal.SIGUSR1)
print("ready", os.environ["RANK"], flush=True)

def wait_for_signal():
    if next_signal(100) is None:
        sys.exit(5)

if os.environ["RANK"] == "0":
    sys.stderr.write("\\rstep 1/3")
    sys.stderr.flush()
    wait_for_signal()
    for step in (2, 3):
        sys.stderr.write(f"\\rstep {step}/3")
        sys.stderr.flush()
    sys.stderr.write("\\n")
else:
    wait_for_signal()
    print("rank 1 line", file=sys.stderr, flush=True)
"""


def _read_until(stream: IO[bytes], marker: bytes, seen: bytearray, timeout: float) -> None:
    """Read ``stream`` into ``seen`` until ``marker`` is in it; fail at the end of the stream or
    after ``timeout`` seconds."""
    fd = stream.fileno()
    os.set_blocking(fd, False)
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while marker not in seen:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {marker!r} after {timeout} s; read so far: {bytes(seen)!r}"
            if selector.select(remaining):
                chunk = os.read(fd, 65536)
                assert chunk, f"stream ended before {marker!r}; read: {bytes(seen)!r}"
                seen += chunk


def test_in_a_pipe_a_progress_bar_shows_before_its_line_ends_as_plain_lines(
        runner: Runner) -> None:
    runner.script("progress.py", _PROGRESS)
    proc = runner.start(["-n", "2", "progress.py"])
    assert proc.stdout is not None and proc.stderr is not None
    runner.read_lines(proc.stdout, 2, contains="ready")  # both handlers are in place
    seen = bytearray()
    # shown while the worker waits, its line unfinished: its first state is not held back
    _read_until(proc.stderr, b"step 1/3\n", seen, runner.timeout)
    proc.send_signal(signal.SIGUSR1)
    _out, rest = proc.communicate(timeout=runner.timeout)
    err = (bytes(seen) + rest).decode()
    assert proc.returncode == 0, err
    # a pipe gets no "\r": the bar's first state, at most one line every few seconds, and its
    # final state, each a line of its own; rank 1's line stands alone
    assert "\r" not in err, repr(err)
    lines = err.splitlines()
    assert "rank 1 line" in lines, err
    bar = [line for line in lines if line != "rank 1 line"]
    assert bar[0] == "step 1/3" and bar[-1] == "step 3/3", err
    assert set(bar) <= {"step 1/3", "step 2/3", "step 3/3"} and len(set(bar)) == len(bar), err


# Prints without flush=True: on a terminal, workers still write each line as it is printed,
# though their stdout is the supervisor's pipe (where Python would buffer it).
_UNFLUSHED = SIGNAL_WAIT + """
import os, signal, sys
on_signals(signal.SIGUSR1)
print("waiting", os.environ["RANK"])
if next_signal(100) is None:
    sys.exit(5)
"""


def test_on_a_terminal_lines_show_as_they_are_printed(runner: Runner) -> None:
    runner.script("unflushed.py", _UNFLUSHED)
    console, terminal = os.openpty()
    try:
        proc = runner.start(["-n", "2", "unflushed.py"], stdout=terminal,
                            drop=["PYTHONUNBUFFERED"])
    finally:
        os.close(terminal)
    with os.fdopen(console, "rb", buffering=0) as screen:
        seen = bytearray()
        _read_until(screen, b"waiting 0", seen, runner.timeout)
        _read_until(screen, b"waiting 1", seen, runner.timeout)  # both before either ended
        proc.send_signal(signal.SIGUSR1)
        assert proc.wait(timeout=runner.timeout) == 0
