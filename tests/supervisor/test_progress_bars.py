"""Real tqdm bars in real ``unirank run`` workers, on a real terminal (a pty) and in a pipe.

On a terminal each rank's bar is redrawn in place below the lines (one row per bar) and its
final state stays; what the screen holds is counted with a tiny terminal (tests/_screen.py). In a
pipe no ``\\r`` or escape sequence gets through and a bar takes a few lines, not one per update.
The ranks meet at a gloo barrier at every step, so their outputs always interleave.
"""

from __future__ import annotations

import fcntl
import os
import re
import selectors
import struct
import sys
import termios
import time
from typing import TYPE_CHECKING

import pytest

from _screen import screen

if TYPE_CHECKING:
    from _procs import Runner

pytestmark = pytest.mark.integration

STEPS = 30
WIDTH = 80
_BARS = f"""
import os, sys
import torch.distributed as dist
from tqdm import tqdm
dist.init_process_group("gloo")
rank = dist.get_rank()
how = sys.argv[1]
if how == "every":
    steps = tqdm(range({STEPS}), desc=f"rank{{rank}}", mininterval=0)
elif how == "position":
    steps = tqdm(range({STEPS}), desc=f"rank{{rank}}", mininterval=0, position=rank)
else:  # a bar on rank 0 only; rank 1 prints a line every third step
    steps = tqdm(range({STEPS}), desc="rank0", mininterval=0) if rank == 0 else range({STEPS})
for step in steps:
    dist.barrier()
    if how == "rank0" and rank == 1 and step % 3 == 0:
        print(f"rank 1 says {{step}}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def _on_a_terminal(runner: Runner, args: list[str]) -> list[str]:
    """Run ``unirank run ARGS`` with stdout and stderr on a pty ``WIDTH`` columns wide; the
    rows its screen then holds that the ranks printed (not gloo's or unirank's own notes)."""
    return [row for row in screen(_received(runner, args), WIDTH)
            if row.startswith(("rank", "[rank"))]


def _received(runner: Runner, args: list[str], columns: int = WIDTH) -> bytes:
    """What ``unirank run ARGS`` wrote to a pty ``columns`` wide (0: a pty of no size, as
    ``script -q -c`` and ``docker -t`` make, 0 rows too)."""
    console, terminal = os.openpty()
    rows = 40 if columns else 0
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    try:
        proc = runner.start(args, stdout=terminal, stderr=terminal)
    finally:
        os.close(terminal)
    received = bytearray()
    timeout = runner.timeout
    deadline = time.monotonic() + timeout
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(console, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"no end after {timeout} s: {bytes(received)!r}"
                if not selector.select(remaining):
                    continue
                try:
                    chunk = os.read(console, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not chunk:
                    break
                received += chunk
        assert proc.wait(timeout=timeout) == 0, bytes(received)
    finally:
        os.close(console)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=timeout)
    return bytes(received)


def _final(rank: int, prefix: str = "") -> re.Pattern[str]:
    return re.compile(rf"{re.escape(prefix)}rank{rank}: 100%\|#*\S*\| {STEPS}/{STEPS} \[.*\]")


@pytest.mark.parametrize("preload", ["fork server", "--no-preload"])
def test_a_bar_on_every_rank_leaves_one_line_a_rank(runner: Runner, preload: str) -> None:
    runner.script("bars.py", _BARS)
    extra = ["--no-preload"] if preload == "--no-preload" else []
    rows = _on_a_terminal(runner, ["-n", "2", *extra, "bars.py", "every"])
    assert len(rows) == 2, rows
    for rank in (0, 1):
        assert sum(bool(_final(rank).fullmatch(row)) for row in rows) == 1, rows
    assert all(len(row) < WIDTH for row in rows), rows


def test_a_terminal_of_no_size_is_taken_as_80_columns(runner: Runner) -> None:
    """``stty size`` says ``0 0`` on a pty nobody sized (``script -q -c``, CI runners, ``docker
    -t``): unknown, so 80 columns (as Python and tqdm take it), not rows cut to one column."""
    runner.script("bars.py", _BARS)
    received = _received(runner, ["-n", "2", "bars.py", "every"], columns=0)
    rows = [row for row in screen(received, WIDTH) if row.startswith("rank")]
    for rank in (0, 1):
        assert sum(bool(_final(rank).fullmatch(row)) for row in rows) == 1, rows
    # the live bars were drawn whole (cut to one column they would show "r" alone)
    live = [draw for draw in re.findall(rb"rank\d: +\d+%", received)]
    assert len(live) > 2, received[:2000]


def test_bars_at_position_rank_leave_what_tqdm_leaves(runner: Runner) -> None:
    # rank 1's bar at position=1 ends drawn twice: tqdm writes its final state where the cursor
    # is (its first row), and the last redraw stays on its second row, as on torchrun's terminal
    runner.script("bars.py", _BARS)
    rows = _on_a_terminal(runner, ["-n", "2", "bars.py", "position"])
    assert 2 <= len(rows) <= 3, rows
    assert any(_final(0).fullmatch(row) for row in rows), rows
    assert any(_final(1).fullmatch(row) for row in rows), rows


@pytest.mark.parametrize("how", ["tagged, --no-preload", "python -u"])
def test_lines_go_above_a_bar_that_is_never_repeated(runner: Runner, how: str) -> None:
    runner.script("bars.py", _BARS)
    if how == "python -u":
        args, prefix = ["--no-python", sys.executable, "-u", "bars.py", "rank0"], ""
    else:
        args, prefix = ["--tag-output", "--no-preload", "bars.py", "rank0"], "[rank{}]:"
    rows = _on_a_terminal(runner, ["-n", "2", *args])
    said = [f"{prefix.format(1)}rank 1 says {step}" for step in range(0, STEPS, 3)]
    assert [row for row in rows if "says" in row] == said, rows
    # the bar shows once, in its final state (where among the lines depends on when rank 1's
    # last lines were read)
    bar = [row for row in rows if "says" not in row]
    assert len(bar) == 1 and _final(0, prefix.format(0)).fullmatch(bar[0]), rows


def test_in_a_pipe_a_bar_takes_a_few_plain_lines(runner: Runner) -> None:
    runner.script("bars.py", _BARS)
    result = runner.run(["-n", "2", "bars.py", "every"])
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stderr and "\x1b" not in result.stderr, repr(result.stderr)
    for rank in (0, 1):
        bar = [line for line in result.stderr.splitlines() if line.startswith(f"rank{rank}:")]
        # its first state shown, one every 5 s at most, its final state: not one line a step
        assert 1 <= len(bar) < STEPS // 2, result.stderr
        assert len(set(bar)) == len(bar), result.stderr
        assert _final(rank).fullmatch(bar[-1]), result.stderr
