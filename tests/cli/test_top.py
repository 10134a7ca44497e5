"""``unirank top``'s bad input: one line, exit code 2, before any store is asked (no job
running on the node, a bad ``--interval`` or ``--count``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from _procs import launcher_free_environ


def _top(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = launcher_free_environ({"TMPDIR": str(tmp_path)})  # no job file in it
    return subprocess.run([sys.executable, "-m", "unirank", "top", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("args", "words"), [
    ((), "no running unirank job on this node"),
    (("--job", "nosuchjob"), "no running unirank job 'nosuchjob' on this node"),
    (("--interval", "0"), "--interval='0': must be a finite number of seconds"),
    (("--interval", "x"), "--interval='x': is not a number of seconds"),
    (("--count", "0"), "--count='0': is not a count of refreshes"),
])
def test_bad_input_is_one_line_and_exit_code_2(tmp_path: Path, args: tuple[str, ...],
                                               words: str) -> None:
    done = _top(tmp_path, *args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("unirank top: error: "), done.stderr
    assert words in lines[0], lines[0]
    assert done.stdout == ""
