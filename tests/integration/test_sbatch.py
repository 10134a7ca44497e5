"""Batch jobs on the two-node testbed: ``sbatch`` scripts with ``srun``, and ``unirank run``
without it. (tests/examples covers ``python examples/helloworld.py`` in a batch script without
srun: a ConfigError naming the srun command.)

The job id comes from sbatch itself (``BatchResult.job_id``); the first step of a batch job is
step 0, so the port must be ``20000 + 12 * (job_id mod 1000) + 0``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import SlurmTestbed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _outputs import (
    JOB_ENV,
    PY,
    REPO,
    check_world,
    console_script,
    parse_hello,
    parse_reduce,
    slurm_port,
)

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

TIMEOUT = 120.0
TWO_BY_TWO = "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n"


def _describe(result: object) -> str:
    return f"{result}\n--- job output ---\n{getattr(result, 'output', '')}"


def test_sbatch_srun_reduction_two_nodes(slurm_testbed: SlurmTestbed) -> None:
    script = f"#!/bin/bash\n{TWO_BY_TWO}cd {REPO}\nsrun {PY} examples/reduction.py\n"
    result = slurm_testbed.sbatch_and_wait(script, timeout=TIMEOUT, env=JOB_ENV)
    assert (result.state, result.exit_code) == ("COMPLETED", 0), _describe(result)
    check_world(parse_reduce(result.output), 4, addr="node1",
                port=slurm_port(result.job_id, 0),
                nodes=["node1", "node1", "node2", "node2"], reduced=True,
                context=result.output)


def test_unirank_run_in_batch_script_goes_through_srun(slurm_testbed: SlurmTestbed) -> None:
    """``unirank run examples/helloworld.py`` in a 2x2 batch script re-executes itself as an srun
    step with one ``unirank run`` per node and the allocation's 2 tasks per node: world 4."""
    unirank = console_script("unirank")
    script = f"#!/bin/bash\n{TWO_BY_TWO}cd {REPO}\n{unirank} run examples/helloworld.py\n"
    result = slurm_testbed.sbatch_and_wait(script, timeout=TIMEOUT, env=JOB_ENV)
    assert (result.state, result.exit_code) == ("COMPLETED", 0), _describe(result)
    assert re.search(r"unirank run: no Slurm step here; starting one per node: srun .*"
                     r"--nodes=2 --ntasks=2 --ntasks-per-node=1", result.output), \
        _describe(result)
    check_world(parse_hello(result.output), 4, addr="node1", port=slurm_port(result.job_id, 0),
                nodes=["node1", "node1", "node2", "node2"], context=result.output)
