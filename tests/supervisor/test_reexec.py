"""``unirank run`` in a Slurm allocation shell with no step (:mod:`unirank.supervisor.reexec`):
the srun command it becomes, the three refusals (one line each, naming the variable and the
command to use), and the re-execution itself, through a stand-in ``srun`` on PATH that prints
what it was given (no Slurm needed; tests/supervisor/test_outer.py runs the real one)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _procs import launcher_free_environ
from unirank.errors import ConfigError
from unirank.supervisor.reexec import REEXEC_VAR, reexec_through_srun, srun_command

INNER = ["python3", "-m", "unirank", "run", "--nnodes", "2", "train.py"]
SHOWN = ("srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1 python3 -m unirank "
         "run --nnodes 2 train.py")


def test_srun_starts_the_inner_command_once_per_node() -> None:
    assert srun_command(2, ["x"]) == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                                      "--kill-on-bad-exit=1", "x"]


def _refusal(environ: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as info:
        reexec_through_srun(2, INNER, environ)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_unirank_no_srun_refuses_with_the_command_to_run() -> None:
    message = _refusal({"UNIRANK_NO_SRUN": "1", "PATH": "/usr/bin"})
    assert message.startswith("UNIRANK_NO_SRUN='1': this is a Slurm allocation shell with no "
                              "step, and UNIRANK_NO_SRUN forbids starting one")
    assert message.endswith(f"HINT: run: {SHOWN}")


def test_no_srun_on_path_refuses_naming_path_and_the_command(tmp_path: Path) -> None:
    message = _refusal({"PATH": str(tmp_path)})
    assert message.startswith(f"PATH='{tmp_path}': this is a Slurm allocation shell with no "
                              "step, and srun is not on PATH")
    assert message.endswith(f"HINT: put Slurm's bin directory on PATH and run: {SHOWN}")


def test_a_second_reexecution_is_refused_instead_of_looping(tmp_path: Path) -> None:
    message = _refusal({REEXEC_VAR: "1", "PATH": str(tmp_path)})
    assert message.startswith("SLURM_STEP_ID=<unset>: unirank run was started by srun but still "
                              "sees an allocation shell with no step")


def test_it_becomes_srun_marked_as_reexecuted(tmp_path: Path) -> None:
    srun = tmp_path / "srun"
    srun.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    f"print(json.dumps([sys.argv[1:], os.environ.get({REEXEC_VAR!r})]))\n")
    srun.chmod(0o755)
    code = ("import sys\nfrom unirank.supervisor.reexec import reexec_through_srun\n"
            f"reexec_through_srun(2, {INNER!r}, {{'PATH': {str(tmp_path)!r}}})\n")
    done = subprocess.run([sys.executable, "-c", code], env=launcher_free_environ(),
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [srun_command(2, INNER)[1:], "1"]
    assert done.stderr == f"unirank run: no Slurm step here; starting one per node: {SHOWN}\n"
