"""``unirank sbatch``'s command line and its ``--config`` file take the same options: each option
that sets the job is a key of the file, each key an option, and both give the same JobSpec."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from unirank.cli.sbatch import add_arguments, build_spec
from unirank.sbatch.config import KEYS
from unirank.sbatch.spec import JobSpec

#: the options that say what unirank sbatch does, or read the program: the command line's alone
COMMAND_ONLY = {"--help", "--config", "--dry-run", "--submit", "--parsable", "--follow",
                "--module"}
#: a value each option takes, where a kind's plain sample would be refused
VALUES: dict[str, Any] = {"time": "10", "signal": "USR2@60", "launch": "tasks",
                          "backend": "gloo", "env": ["NCCL_DEBUG=INFO"],
                          "setup": ["module load cuda"], "sbatch-arg": ["--exclusive"],
                          "nodes": "1:2", "rdzv-conf": "last_call_timeout=5"}
#: options that need another one given with them (both ways alike)
NEEDS: dict[str, list[str]] = {"rdzv-conf": ["--nnodes", "1:2"]}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="unirank sbatch")
    add_arguments(parser)
    return parser


def _job_options() -> list[argparse.Action]:
    """The command line's options that set the job, as argparse holds them."""
    return [action for action in _parser()._actions
            if action.option_strings and action.option_strings[-1] not in COMMAND_ONLY]


def _spec(argv: list[str]) -> JobSpec:
    return build_spec(_parser().parse_args([*argv, "train.py"]))


def test_the_file_s_keys_are_the_command_line_s_job_options() -> None:
    assert {a.option_strings[-1] for a in _job_options()} == {f"--{key}" for key in KEYS}


@pytest.mark.parametrize("flag", [a.option_strings[-1] for a in _job_options()])
def test_an_option_and_its_key_give_the_same_job(flag: str, tmp_path: Path) -> None:
    key = flag.removeprefix("--")
    action = next(a for a in _job_options() if a.option_strings[-1] == flag)
    if action.nargs == 0:  # a flag without a value
        value: Any = True
        argv = [flag]
    else:
        value = VALUES.get(key, 2 if action.type is int else "x")
        items = value if isinstance(value, list) else [value]
        argv = [f"{flag}={item}" for item in items]
    toml = tmp_path / "job.toml"
    shown = repr(value).replace("True", "true").replace("'", '"')
    toml.write_text(f"{key} = {shown}\n")
    needs = NEEDS.get(key, [])
    from_flag = _spec([*needs, *argv])
    assert _spec([*needs, "--config", str(toml)]) == from_flag
    assert from_flag != _spec(needs), f"{flag} changed nothing"
