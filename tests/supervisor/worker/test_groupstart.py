"""``--init-timeout`` bounds the start of the process group too: real ``unirank run`` workers,
with the fork server and without (``--no-preload``).

Every rank's process starts and joins at once; rank 2 then blocks, before it starts its group,
on an event that is never set (it ends by the teardown's SIGTERM), while ranks 0 and 1 wait in
theirs. The watchdog's own timeout (3 s) is the only clock: the tests assert the rank named, not
the time it took (torch alone would wait 30 minutes, past the test's timeout).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from _procs import Runner

pytestmark = pytest.mark.integration

PRELOAD = pytest.mark.parametrize("preload", [[], ["--no-preload"]], ids=["forked", "no-preload"])

_BLOCK_RANK_2 = """
import os, threading
if os.environ["RANK"] == "2":
    threading.Event().wait()  # never set: this rank never starts its group
"""

_NAMED = ("init timeout: 1 of 3 ranks did not start their process group within 3 s: "
          "rank 2 (on ")

STARTS = {
    "ur.init": "import unirank as ur\nur.init(backend='gloo')\n",
    "init_process_group": "import torch.distributed as dist\ndist.init_process_group('gloo')\n",
}


@PRELOAD
@pytest.mark.parametrize("start", sorted(STARTS))
def test_a_rank_slow_to_start_its_group_is_named(runner: Runner, preload: list[str],
                                                 start: str) -> None:
    runner.script("slow_rank.py", _BLOCK_RANK_2 + STARTS[start] + "print('STARTED', flush=True)\n")
    result = runner.run(["-n", "3", "--init-timeout", "3", *preload, "slow_rank.py"])
    assert result.returncode == 1, result.stderr
    assert "STARTED" not in result.stdout
    summary = result.stderr[result.stderr.index("unirank run: FAILED"):]
    first = summary.splitlines()[0]
    assert first.startswith("unirank run: FAILED (exit code 1): rank ") and "rank 2" not in first
    assert _NAMED in summary, result.stderr
    assert "InitTimeoutError" in summary
    # rank 2 ended by the teardown (with the other waiting rank, when it was still waiting)
    assert re.search(r"other workers: .*\b2: killed by SIGTERM \(signal 15\), stopped by the "
                     r"teardown", summary), summary


def test_ranks_that_start_no_group_are_not_waited_for(runner: Runner) -> None:
    """No rank starts a group (no distributed work): rank 0 outlasting the init timeout while
    rank 1 has ended fails nothing. (A guard on the design: the old code passed it too.)"""
    runner.script("no_group.py", """
import os, time
if os.environ["RANK"] == "0":
    time.sleep(3)  # three times the init timeout: the scenario, not a synchronisation
    print("DONE 0", flush=True)
""")
    result = runner.run(["-n", "2", "--init-timeout", "1", "no_group.py"])
    assert result.returncode == 0, result.stderr
    assert "DONE 0" in result.stdout
    assert "init timeout" not in result.stderr


def test_a_rank_slow_to_start_its_second_group_is_named(runner: Runner) -> None:
    """Each start of the group has its own keys: after a first group that every rank started
    and ended, a rank slow to start the second one is named too."""
    runner.script("twice.py", """
import os, threading
import torch, torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
if os.environ["RANK"] == "2":
    threading.Event().wait()
dist.init_process_group("gloo")
print("STARTED AGAIN", flush=True)
""")
    result = runner.run(["-n", "3", "--init-timeout", "3", "twice.py"])
    assert result.returncode == 1, result.stderr
    assert _NAMED in result.stderr
    assert "STARTED AGAIN" not in result.stdout
