"""``unirank run`` inside real outer launchers: srun with one task per node (the per-node launcher),
a bare ``salloc``/``sbatch`` allocation (re-executed through srun, or refused with the command),
and Open MPI's mpirun.

Needs the two-node Slurm testbed (``scripts/testbed``) and Open MPI; both nodes run on this machine,
so the script is shared through the test's folder.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from _procs import Runner

pytestmark = pytest.mark.integration

SCRIPT = """
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"RESULT rank={dist.get_rank()} world={dist.get_world_size()} "
      f"group={os.environ['GROUP_RANK']} local={os.environ['LOCAL_RANK']} "
      f"node={os.environ.get('SLURMD_NODENAME', '-')} master={os.environ['MASTER_ADDR']} "
      f"sum={t.item():g}", flush=True)
dist.destroy_process_group()
"""

_RESULT = re.compile(r"RESULT rank=(\d+) world=(\d+) group=(\d+) local=(\d+) node=(\S+) "
                     r"master=(\S+) sum=(\d+)")


def _results(text: str) -> dict[int, tuple[str, ...]]:
    # Workers share the step's stdout; an unbuffered print writes its text and its newline
    # apart, so a line may end up glued to the next one: match within lines, not whole lines.
    return {int(m[0]): m[1:] for m in _RESULT.findall(text)}


def _script(folder: Path) -> str:
    path = folder / "allreduce.py"
    path.write_text(SCRIPT)
    return str(path)


def _assert_two_nodes_of_two(results: dict[int, tuple[str, ...]]) -> None:
    assert sorted(results) == [0, 1, 2, 3], results
    for rank, (world, group, local, node, master, total) in results.items():
        assert (world, total) == ("4", "10")
        assert group == str(rank // 2) and local == str(rank % 2)
        assert node == f"node{rank // 2 + 1}"
        assert master == "node1"


def test_srun_one_task_per_node(slurm_testbed: Any) -> None:
    script = _script(slurm_testbed.work_dir)
    result = slurm_testbed.srun(Runner.command(["-n", "2", script],
                                               prefix=["-N2", "--ntasks-per-node=1"]),
                                timeout=120)
    _assert_two_nodes_of_two(_results(result.stdout))


def test_srun_with_several_tasks_per_node_runs_each_task_as_one_rank(slurm_testbed: Any) -> None:
    """The planner's rule 3: each task srun started is one rank (as Parallel does in place)."""
    script = _script(slurm_testbed.work_dir)
    result = slurm_testbed.srun(Runner.command([script], prefix=["-N2", "--ntasks-per-node=2"]),
                                timeout=120)
    _assert_two_nodes_of_two(_results(result.stdout))


def test_srun_tasks_per_node_disagreeing_with_nproc_is_refused(slurm_testbed: Any) -> None:
    script = _script(slurm_testbed.work_dir)
    result = slurm_testbed.srun(Runner.command(["-n", "4", script], prefix=["-N1", "-n2"]),
                                timeout=120, check=False)
    assert result.returncode == 2, result.stderr
    assert "--nproc-per-node='4': disagrees with the slurm launcher, which started 2 " \
           "processes on this node" in result.stderr
    assert "srun --ntasks-per-node=1" in result.stderr
    assert "RESULT" not in result.stdout


def test_salloc_shell_goes_through_srun(slurm_testbed: Any) -> None:
    script = _script(slurm_testbed.work_dir)
    result = slurm_testbed.salloc(Runner.command(["-n", "2", script], prefix=["-N2"]),
                                  timeout=120)
    assert "unirank run: no Slurm step here; starting one per node: srun --nodes=2 --ntasks=2 " \
           "--ntasks-per-node=1" in result.stderr
    _assert_two_nodes_of_two(_results(result.stdout))


def test_salloc_shell_without_srun_fails_at_once_with_the_command(slurm_testbed: Any) -> None:
    script = _script(slurm_testbed.work_dir)
    result = slurm_testbed.salloc(Runner.command(["-n", "2", script], prefix=["-N2"]),
                                  timeout=120, env={"UNIRANK_NO_SRUN": "1"},
                                  check=False)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("unirank run:")]
    assert len(errors) == 1
    assert "HINT: run: srun --nodes=2 --ntasks=2 --ntasks-per-node=1" in errors[0]
    assert "-m unirank run --nnodes 2 -n 2 " in errors[0]  # each option once
    assert errors[0].endswith(script)


def test_sbatch_script_goes_through_srun(slurm_testbed: Any) -> None:
    script = _script(slurm_testbed.work_dir)
    batch = slurm_testbed.sbatch_and_wait(
        f"{sys.executable} -m unirank run -n 2 {script}\n", timeout=120, args=["-N2"]
    )
    assert batch.state == "COMPLETED", batch.output
    _assert_two_nodes_of_two(_results(batch.output))


def test_mpirun_one_process_per_node(mpirun: list[str], runner: Runner) -> None:
    script = _script(runner.cwd)
    result = runner.run(["-n", "2", script], prefix=[*mpirun, "-np", "1"], timeout=120)
    assert result.returncode == 0, result.stderr
    results = _results(result.stdout)
    assert sorted(results) == [0, 1]
    assert {r[0] for r in results.values()} == {"2"} and {r[-1] for r in results.values()} == {"3"}


def test_mpirun_two_processes_on_one_node_run_in_place(mpirun: list[str], runner: Runner) -> None:
    """Each of mpirun's two ranks is one rank; a disagreeing -n is refused with the command."""
    script = _script(runner.cwd)
    result = runner.run([script], prefix=[*mpirun, "-np", "2"], timeout=120)
    assert result.returncode == 0, result.stderr
    results = _results(result.stdout)
    assert sorted(results) == [0, 1]
    assert {r[0] for r in results.values()} == {"2"} and {r[-1] for r in results.values()} == {"3"}
    refused = runner.run(["-n", "3", script], prefix=[*mpirun, "-np", "2"], timeout=120)
    assert refused.returncode != 0
    assert "mpirun --map-by ppr:1:node" in refused.stderr
    assert "RESULT" not in refused.stdout
