"""A Slurm allocation shell where no task was launched (an ``sbatch`` script, an ``salloc``
shell), under the real sbatch and salloc of the two-node testbed, for ``ur.init``, ``with
ur.Parallel`` and ``unirank run``: one rule (``DistEnv.must_launch``) and one behaviour.

* one task: ``ur.init`` and ``Parallel`` run in place at world size 1;
* two tasks: both fail with one line naming the srun command (no traceback, no hang);
* ``unirank run`` re-executes itself through srun in both, with the allocation's tasks per node,
  and prints the re-run line with each option once.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import SlurmTestbed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _outputs import JOB_ENV, PY, REPO, SCRIPTS, console_script, tagged_json

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

TIMEOUT = 120.0
SCRIPT = str(SCRIPTS / "alloc_shell.py")
CASES = [(entry, tasks) for entry in ("init", "parallel", "run") for tasks in (1, 2)]


def _command(entry: str, tasks: int) -> list[str]:
    """The command; ``unirank run`` is given ``-n`` for two tasks, and left to the allocation's
    tasks per node for one."""
    if entry == "run":
        count = ["-n", str(tasks)] if tasks > 1 else []
        return [console_script("unirank"), "run", *count, SCRIPT, "init"]
    return [PY, SCRIPT, entry]


def _check(entry: str, tasks: int, code: int, output: str, shell_node: str) -> None:
    worlds = tagged_json(output, "WORLD")
    if entry == "run":  # through srun: the step's tasks on node1, each one rank
        assert code == 0, output
        rerun = [line for line in output.splitlines() if "starting one per node: srun" in line]
        assert len(rerun) == 1, output
        words = rerun[0].split()
        assert words.count("--nnodes") == 1, output  # each option once
        assert words.count("--nproc-per-node") + words.count("-n") == 1, output
        assert sorted((w["rank"], w["world"], w["node"]) for w in worlds) == [
            (rank, tasks, "node1") for rank in range(tasks)], output
        return
    if tasks == 1:  # in place, at world size 1, naming the shell's node
        assert code == 0, output
        assert [(w["rank"], w["world"], w["backend"], w["launcher"], w["node"])
                for w in worlds] == [(0, 1, "gloo", "slurm-allocation", shell_node)], output
        return
    assert code != 0 and worlds == [], output
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if "error:" in line]
    assert len(errors) == 1, output
    assert errors[0].startswith("alloc_shell.py: error: SLURM_STEP_ID=<unset>: this is a Slurm "
                                "allocation shell (sbatch or salloc) holding 2 tasks"), output
    assert errors[0].endswith(f"HINT: start the tasks with: srun {Path(PY).name} {SCRIPT} "
                              f"{entry}"), output


@pytest.mark.parametrize(("entry", "tasks"), CASES)
def test_sbatch_script(slurm_testbed: SlurmTestbed, entry: str, tasks: int) -> None:
    """``sbatch -N1 -n{tasks} -w node1`` running the command in its batch script (on node1:
    named, so that a node still completing the previous test's job never moves it)."""
    command = " ".join(_command(entry, tasks))
    result = slurm_testbed.sbatch_and_wait(f"cd {REPO}\n{command}\n", timeout=TIMEOUT,
                                           args=["-N1", f"-n{tasks}", "-w", "node1"],
                                           env=JOB_ENV)
    _check(entry, tasks, result.exit_code, result.output, "node1")


@pytest.mark.parametrize(("entry", "tasks"), CASES)
def test_salloc_shell(slurm_testbed: Any, entry: str, tasks: int) -> None:
    """``salloc -N1 -n{tasks} -w node1 COMMAND``: the command runs where salloc was typed, its
    srun's tasks on node1 (named: a node still completing the previous test's job is passed
    over otherwise, seen when the Slurm tests run back to back)."""
    proc = slurm_testbed.salloc(["-N1", f"-n{tasks}", "-w", "node1", *_command(entry, tasks)],
                                timeout=TIMEOUT,
                                env=JOB_ENV, check=False)
    _check(entry, tasks, proc.returncode, proc.stdout + proc.stderr, socket.gethostname())
