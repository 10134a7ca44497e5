"""``unirank run`` refuses a target that cannot start, in python's words, before any worker."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from _procs import Runner
from unirank.cli.target import TargetProblem, check_target


def _check(program: str, cwd: Path, *, module: bool = False, no_python: bool = False,
           path: str = "/usr/bin:/bin") -> TargetProblem | None:
    return check_target(program, module=module, no_python=no_python, cwd=str(cwd),
                        environ={"PATH": path})


def test_a_missing_script_is_refused_as_python_refuses_it(tmp_path: Path) -> None:
    assert _check("nosuch.py", tmp_path) == TargetProblem(
        f"can't open file '{tmp_path}/nosuch.py': [Errno 2] No such file or directory", 2)
    (tmp_path / "there.py").write_text("")
    (tmp_path / "app").mkdir()  # python runs a folder's __main__.py: left to it
    assert _check("there.py", tmp_path) is None
    assert _check(str(tmp_path / "there.py"), Path("/")) is None
    assert _check("app", tmp_path) is None


def test_a_missing_module_is_refused_without_importing_its_package(tmp_path: Path) -> None:
    assert _check("nosuch", tmp_path, module=True) == TargetProblem("No module named nosuch", 1)
    assert _check("nosuch.train", tmp_path, module=True) == TargetProblem(
        "Error while finding module specification for 'nosuch.train' "
        "(ModuleNotFoundError: No module named 'nosuch')", 1)
    assert _check("json.tool", tmp_path, module=True) is None
    package = tmp_path / "loud"
    package.mkdir()
    (package / "__init__.py").write_text("raise SystemExit('imported')\n")
    # found in the current folder, as python -m finds it; its __init__ never runs here
    assert _check("loud.train", tmp_path, module=True) is None
    assert "loud" not in sys.modules


def test_a_program_without_python_must_be_on_path_and_executable(tmp_path: Path) -> None:
    assert _check("nosuch-program", tmp_path, no_python=True) == TargetProblem(
        "nosuch-program: command not found", 127)
    assert _check("sh", tmp_path, no_python=True) is None
    assert _check("./nosuch.sh", tmp_path, no_python=True) == TargetProblem(
        "./nosuch.sh: No such file or directory", 127)
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n")
    assert _check("./job.sh", tmp_path, no_python=True) == TargetProblem(
        "./job.sh: Permission denied", 126)
    script.chmod(0o755)
    assert _check("./job.sh", tmp_path, no_python=True) is None


@pytest.mark.parametrize(("args", "line", "code"), [
    (["nosuch.py"], "unirank run: can't open file '{cwd}/nosuch.py': "
     "[Errno 2] No such file or directory", 2),
    (["-m", "nosuch"], "unirank run: No module named nosuch", 1),
    (["--no-python", "nosuch-program"], "unirank run: nosuch-program: command not found", 127),
])
def test_unirank_run_says_one_line_and_starts_no_worker(runner: Runner, tmp_path: Path,
                                                         args: list[str], line: str,
                                                         code: int) -> None:
    proc = runner.run(["-n", "2", *args])
    assert proc.stderr == line.format(cwd=os.path.realpath(tmp_path)) + "\n"
    assert proc.returncode == code
    assert proc.stdout == ""
