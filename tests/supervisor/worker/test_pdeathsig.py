"""PR_SET_PDEATHSIG for real: a process whose parent is SIGKILLed dies with it."""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from _procs import Runner

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

_CHILD = """
import os, sys, threading
from unirank.supervisor.worker.pdeathsig import die_with_parent
armed = die_with_parent(int(sys.argv[1]))
print(f"child {os.getpid()} armed {armed}", flush=True)
threading.Event().wait(100)
"""

_MIDDLE = """
import os, subprocess, sys, threading
subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid()), "pdeathsig-child-mark"])
threading.Event().wait(100)
"""


def test_child_dies_when_its_parent_is_killed(runner: Runner) -> None:
    middle = runner.start([], command=[sys.executable, "-c", _MIDDLE, _CHILD])
    assert middle.stdout is not None
    lines = runner.read_lines(middle.stdout, 1, contains="armed")
    words = lines[-1].split()
    assert words[2:] == ["armed", "True"]
    middle.kill()
    middle.communicate(timeout=runner.timeout)
    assert runner.wait_gone([int(words[1])], mark=b"pdeathsig-child-mark") == []


def test_child_of_a_parent_already_gone_exits_at_once() -> None:
    # expected parent 1 is not our parent: the race check must end the process by SIGKILL
    result = subprocess.run([sys.executable, "-c", _CHILD, "1"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == -9
    assert "armed" not in result.stdout
