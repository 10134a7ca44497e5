"""The rank blamed for a failure is the one that failed first, whatever order the supervisor
sees the exits in: real ``unirank run`` workers in a real gloo group, with the fork server and
without (``--no-preload``).

In each script rank 1 fails while rank 0 waits in a barrier; rank 0 then fails too, with
gloo's "Connection closed by peer" (or "reset by peer"). Where a test fixes the order of the
exits, rank 1 closes its group (so rank 0 fails) and ends only once rank 0's process has ended
(a pidfd, with a timeout): the supervisor always sees rank 0's exit first.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from _procs import Runner

pytestmark = pytest.mark.integration

PRELOAD = pytest.mark.parametrize("preload", [[], ["--no-preload"]], ids=["forked", "no-preload"])

_GROUP = """
import atexit, os, select, signal, sys
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
pids = [0, 0]
dist.all_gather_object(pids, os.getpid())

def after_rank_0():
    # close the group (rank 0's barrier fails), then wait until rank 0's process has ended
    dist.destroy_process_group()
    try:
        fd = os.pidfd_open(pids[0])
    except ProcessLookupError:
        return  # rank 0 has ended and been reaped already
    select.select([fd], [], [], 60)
"""


def _summary(stderr: str) -> str:
    return stderr[stderr.index("unirank run: FAILED"):]


@PRELOAD
def test_sys_exit_of_rank_1_is_blamed_not_the_barrier_it_broke(runner: Runner,
                                                               preload: list[str]) -> None:
    """The issue's repro: rank 1 calls ``sys.exit(3)`` while rank 0 waits in a barrier."""
    runner.script("exit3.py", """
import sys
import torch.distributed as dist
import unirank as ur
ur.init(backend="gloo")
if dist.get_rank() == 1:
    sys.exit(3)
dist.barrier()
""")
    result = runner.run(["-n", "2", *preload, "exit3.py"])
    assert result.returncode == 3, result.stderr
    assert _summary(result.stderr).startswith(
        "unirank run: FAILED (exit code 3): rank 1 (local rank 1)"), result.stderr


@PRELOAD
def test_sys_exit_seen_after_the_peer_s_failure_is_still_the_root_cause(
        runner: Runner, preload: list[str]) -> None:
    """Rank 1's ``sys.exit(3)`` ends its process only after rank 0 failed and ended: the time
    rank 1 recorded at its exit, not the order of the exits, names it."""
    runner.script("late_exit.py", _GROUP + """
if rank == 1:
    atexit.register(after_rank_0)
    sys.exit(3)
dist.barrier()
""")
    result = runner.run(["-n", "2", *preload, "late_exit.py"])
    assert result.returncode == 3, result.stderr
    summary = _summary(result.stderr)
    assert summary.startswith("unirank run: FAILED (exit code 3): rank 1 (local rank 1)"), \
        result.stderr
    assert re.search(r"Connection (closed|reset) by peer", result.stderr)  # rank 0's failure
    assert "rank 0: exit code 1" in summary


@PRELOAD
def test_a_rank_killed_by_a_signal_is_blamed_over_the_peer_that_lost_it(
        runner: Runner, preload: list[str]) -> None:
    """Rank 1 dies by SIGKILL (no record of its own) after rank 0 recorded "Connection closed by
    peer" and ended: rank 0's record is the consequence, rank 1 the root cause. Rank 1 ignores
    the teardown's SIGTERM, so that its SIGKILL is its own."""
    runner.script("killed.py", _GROUP + """
if rank == 1:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    after_rank_0()
    os.kill(os.getpid(), signal.SIGKILL)
dist.barrier()
""")
    result = runner.run(["-n", "2", *preload, "killed.py"])
    assert result.returncode == 128 + 9, result.stderr
    summary = _summary(result.stderr)
    assert summary.startswith(
        "unirank run: FAILED (exit code 137): rank 1 (local rank 1) on node"), result.stderr
    assert "killed by SIGKILL (signal 9)" in summary.splitlines()[0]
