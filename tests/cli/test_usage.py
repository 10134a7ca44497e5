"""Usage errors are one line for every subcommand (cli/usage.py, installed by cli/main.py for
all of them): an unknown option is named with the nearest known one, exit status 2, no usage
block. Real ``python -m unirank`` processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from unirank.cli.main import SUBCOMMANDS
from unirank.exitcodes import USAGE

SRC = Path(__file__).resolve().parents[2] / "src"


def _unirank(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "unirank", *args], capture_output=True,
                          text=True, timeout=60, cwd=cwd, env=env, stdin=subprocess.DEVNULL)


def test_run_names_the_option_it_does_not_know_and_the_nearest_one(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("")
    done = _unirank("run", "--nprocs", "2", "x.py", cwd=tmp_path)
    assert done.returncode == USAGE
    assert done.stderr == ("unirank run: error: unknown option --nprocs (did you mean "
                           "--nproc-per-node?) HINT: options go before SCRIPT; unirank run "
                           "--help lists them\n"), done.stderr


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_subcommand_refuses_an_unknown_option_in_one_line(command: str,
                                                                 tmp_path: Path) -> None:
    done = _unirank(command, "--zzzzzz", cwd=tmp_path)
    assert done.returncode == USAGE, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"unirank {command}: error: unknown option --zzzzzz "
                                  "HINT: "), done.stderr
    assert f"unirank {command} --help lists them" in done.stderr


def test_a_misspelt_option_value_form_is_named_without_its_value(tmp_path: Path) -> None:
    done = _unirank("hello", "--backnd=gloo", cwd=tmp_path)
    assert done.returncode == USAGE
    assert done.stderr == ("unirank hello: error: unknown option --backnd (did you mean "
                           "--backend?) HINT: unirank hello --help lists them\n"), done.stderr
