"""A worker crashing on one node of a two-node step: the step fails fast, naming that rank, and
no process is left behind on either node (both testbed nodes are this machine, so ``pgrep``
sees them all).
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import SlurmTestbed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _outputs import JOB_ENV, REPO, SCRIPTS, console_script

from _procs import wait_gone

pytestmark = [pytest.mark.slurm, pytest.mark.integration]


def test_crash_of_rank_3_on_node2_ends_the_step_and_leaves_nothing(
    slurm_testbed: SlurmTestbed,
) -> None:
    """``srun -N2 --ntasks-per-node=1 unirank run -n 2 crash_rank.py 3 MARKER``: rank 3 (node2,
    local rank 1) raises after joining; ranks 0-2 wait in a barrier that can never complete
    (torch's collective timeout is 30 min). Only the failure handling (node2's supervisor
    stopping rank 2, gloo reporting the lost peers on node1) can end the step before the
    120 s srun timeout, which fails the test."""
    marker = f"unirank-crash-{uuid.uuid4().hex[:12]}"
    result = slurm_testbed.srun(
        ["-N2", "--ntasks-per-node=1", f"--chdir={REPO}", console_script("unirank"), "run",
         "-n", "2", str(SCRIPTS / "crash_rank.py"), "3", marker],
        timeout=120, env=JOB_ENV, check=False,
    )
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    started = {int(m[0]): (int(m[1]), m[2])
               for m in re.findall(r"^PID (\d+) (\d+) (\S+)$", result.stdout, re.M)}
    assert sorted(started) == [0, 1, 2, 3], f"not every rank started:\n{out}"
    assert started[3][1] == "node2", out
    # the supervisor on node2 names the crashed rank, its node and its error
    assert re.search(r"unirank run: FAILED \(exit code \d+\): rank 3 \(local rank 1\) on node "
                     r"node2", result.stderr), out
    assert f"crash marker {marker} on rank 3" in result.stderr, out
    # nothing left: every worker's pid is gone, and no process carries the marker
    alive = wait_gone([pid for pid, _ in started.values()], timeout=10)
    assert alive == [], f"workers still alive after the step ended: {alive}\n{out}"
    left = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True, timeout=30)
    assert left.stdout.strip() == "", f"processes left behind:\n{left.stdout}\n{out}"
