"""The no-preload lane: the suites that start workers, run again with ``UNIRANK_NO_PRELOAD=1``,
so that workers started as their own interpreters (``--no-preload``, the fallback of the fork
server) keep every behaviour those suites check, as the forked workers do by default.

tests/_procs.py's ``launcher_free_environ`` keeps UNIRANK_NO_PRELOAD, so every ``unirank run``
those suites start inherits it. Left out: the tests that check the fork server itself (its
timeline rows, tests/supervisor/fork/test_forkserver.py), those that need the Slurm testbed or
mpirun, and the import-time value tests, which with no server compare a fresh interpreter
with itself.

Environment variables read: the caller's environment, without launcher variables, for the
inner pytest.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from _procs import launcher_free_environ

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 1200.0
MODULES = ("tests/supervisor/test_procs.py", "tests/supervisor/worker/test_bootstrap.py",
           "tests/supervisor/test_whole_lines.py", "tests/supervisor/worker/test_timeline.py",
           "tests/supervisor/fork/test_forked_worker.py")
LEFT_OUT = ("tests/supervisor/worker/test_timeline.py::test_timeline_of_a_local_run",
            "tests/supervisor/fork/test_forked_worker.py::test_import_time_values_are_the_worker_s_own")


@pytest.mark.parametrize("module", MODULES, ids=lambda path: Path(path).stem)
def test_the_suites_pass_without_the_fork_server(module: str) -> None:
    """One module a test, so that a parallel run spreads the lane over its workers."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "-m", "not slurm and not mpi", module,
               *(arg for test in LEFT_OUT if test.startswith(f"{module}::")
                 for arg in ("--deselect", test))]
    proc = subprocess.run(command, cwd=REPO, env=launcher_free_environ({"UNIRANK_NO_PRELOAD": "1"}),
                          capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL)
    tail = (proc.stdout + proc.stderr)[-8000:]
    assert proc.returncode == 0, tail
    assert " passed" in tail, tail
    if any(test.startswith(f"{module}::") for test in LEFT_OUT):
        assert "deselected" in tail, tail
