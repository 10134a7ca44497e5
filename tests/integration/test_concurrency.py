"""Several rendezvous at once on the same nodes: two steps of one job, and two jobs.

That they really overlap is proved without sleeping: task 0 of each step (or job) opens the same
named pipe, one for writing and one for reading (``scripts/meet.sh``); an open blocks until the
other end is opened, so both get past it only while both are running (30 s limit, then the step
fails with ``MEET_TIMEOUT``). Right after, both run the example with their own derived ports.
"""

from __future__ import annotations

import concurrent.futures
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import BatchResult, SlurmTestbed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _outputs import (
    JOB_ENV,
    PY,
    REPO,
    SCRIPTS,
    RankLine,
    check_world,
    parse_hello,
    parse_reduce,
    slurm_port,
)

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

TIMEOUT = 150.0
MEET = SCRIPTS / "meet.sh"


def _by_port(lines: list[RankLine]) -> dict[int, list[RankLine]]:
    groups: dict[int, list[RankLine]] = defaultdict(list)
    for line in lines:
        groups[line.port].append(line)
    return dict(groups)


def _fifo(testbed: SlurmTestbed, name: str) -> Path:
    path = Path(testbed.work_dir) / name
    if path.exists():
        path.unlink()
    os.mkfifo(path)
    return path


def test_two_steps_at_once_in_one_allocation_get_different_ports(
    slurm_testbed: SlurmTestbed,
) -> None:
    fifo = _fifo(slurm_testbed, "steps.fifo")
    step = (f"srun --exact --kill-on-bad-exit=1 -N2 -n2 --ntasks-per-node=1 {MEET} {fifo}")
    script = (
        "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n"
        f"cd {REPO}\n"
        f"{step} write {PY} examples/reduction.py &\nfirst=$!\n"
        f"{step} read {PY} examples/reduction.py &\nsecond=$!\n"
        "wait $first; a=$?\nwait $second; b=$?\n"
        'echo "STEPS_RC $a $b"\nexit $((a | b))\n'
    )
    result = slurm_testbed.sbatch_and_wait(script, timeout=TIMEOUT, env=JOB_ENV)
    out = result.output
    assert (result.state, result.exit_code) == ("COMPLETED", 0), f"{result}\n{out}"
    assert "MET write" in out and "MET read" in out, out
    groups = _by_port(parse_reduce(out))
    assert set(groups) == {slurm_port(result.job_id, 0), slurm_port(result.job_id, 1)}, out
    for lines in groups.values():
        check_world(lines, 2, addr="node1", nodes=["node1", "node2"], reduced=True, context=out)


def test_two_jobs_at_once_on_the_same_nodes_get_different_ports(
    slurm_testbed: SlurmTestbed,
) -> None:
    fifo = _fifo(slurm_testbed, "jobs.fifo")

    def job(role: str) -> BatchResult:
        script = (
            "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
            f"cd {REPO}\nsrun --kill-on-bad-exit=1 {MEET} {fifo} {role} "
            f"{PY} examples/helloworld.py\n"
        )
        return slurm_testbed.sbatch_and_wait(script, timeout=TIMEOUT, env=JOB_ENV)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(job, ["write", "read"]))
    ports = []
    for result, role in zip(results, ["write", "read"]):
        out = result.output
        assert (result.state, result.exit_code) == ("COMPLETED", 0), f"{result}\n{out}"
        assert f"MET {role}" in out, out
        port = slurm_port(result.job_id, 0)
        check_world(parse_hello(out), 2, addr="node1", port=port, nodes=["node1", "node2"],
                    context=out)
        ports.append(port)
    assert results[0].job_id != results[1].job_id
    assert ports[0] != ports[1], ports
