"""``ur.init(on_hang=...)`` decides what ``unirank run`` does once ``--hang-timeout`` ended the
workers, over ``--on-hang`` and its default: real processes, two ranks on this host, rank 1
asleep in user code before its second collective in the first attempt only.

Environment variables read: the caller's environment, from which launcher variables are removed
(see ``tests/_procs.py``).
"""

from __future__ import annotations

import pytest

from _procs import Runner

pytestmark = pytest.mark.integration

# rank 1 sleeps before the second all_reduce of attempt 0 (alive, never entering it)
SCRIPT = """
import os, sys, time
import torch
import torch.distributed as dist
import unirank as ur

ur.init("gloo", on_hang=sys.argv[1])
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() == 1 and restart == "0":
    time.sleep(1e9)
dist.all_reduce(t)
print(f"done rank {dist.get_rank()} restart {restart}", flush=True)
ur.finalize()
"""


def test_on_hang_exit_ends_the_job_though_restarts_are_left(runner: Runner) -> None:
    """``--max-restarts 1`` alone would restart (``--on-hang``'s default with restarts left);
    the keyword ``on_hang="exit"`` ends the job with the hang timeout's 86, no restart."""
    runner.script("hang.py", SCRIPT)
    ended = runner.run(["-n", "2", "--max-restarts", "1", "--hang-timeout", "3", "hang.py",
                        "exit"])
    assert ended.returncode == 86, ended.stderr
    assert "restarting the workers" not in ended.stderr, ended.stderr
    assert "done rank" not in ended.stdout, ended.stdout


def test_on_hang_restart_wins_over_the_command_line_s_exit(runner: Runner) -> None:
    """``--on-hang exit`` on the command line, ``on_hang="restart"`` in the program: the
    program's word wins, the workers start again and finish."""
    runner.script("hang.py", SCRIPT)
    ended = runner.run(["-n", "2", "--max-restarts", "1", "--hang-timeout", "3",
                        "--on-hang", "exit", "hang.py", "restart"])
    assert ended.returncode == 0, ended.stderr
    assert "attempt 0 failed (rank 1: exit code 86); restarting the workers" in ended.stderr, \
        ended.stderr
    assert sorted(ended.stdout.split("\n")[:-1]) == ["done rank 0 restart 1",
                                                     "done rank 1 restart 1"], ended.stdout


def test_evict_in_a_static_world_is_refused_by_init_naming_the_keyword(runner: Runner) -> None:
    """As ``--on-hang evict`` is refused there: the summary's error line names ``on_hang``."""
    runner.script("hang.py", SCRIPT)
    ended = runner.run(["-n", "2", "hang.py", "evict"])
    assert ended.returncode != 0
    assert "  error: ConfigError: on_hang='evict': needs an elastic job" in ended.stderr, \
        ended.stderr
