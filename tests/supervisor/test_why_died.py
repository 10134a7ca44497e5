"""Why a worker died, in the failure summary of real ``unirank run`` workers, forked from the
fork server and started as their own interpreters (``--no-preload``): a real OOM kill in a
real memory cgroup with a limit (as root: cgroup v2's ``memory.max`` where the memory
controller is on v2, else v1's ``memory.limit_in_bytes``), a plain ``kill -9`` that is not
one, and the Python stack at a real SIGSEGV and SIGABRT."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import pytest

from _procs import unavailable

if TYPE_CHECKING:
    from _procs import Runner

pytestmark = pytest.mark.integration

PRELOAD = pytest.mark.parametrize("preload", [[], ["--no-preload"]], ids=["forked", "no-preload"])
#: the memory limit of the test's cgroup: the fork server's torch, the parent and two workers fit
LIMIT_MIB = 800

HOG = """
import os
if os.environ["RANK"] == "1":
    hoard = []
    while True:
        hoard.append(bytearray(16 << 20))
"""
KILL9 = """
import os, signal
if os.environ["RANK"] == "1":
    os.kill(os.getpid(), signal.SIGKILL)
"""
SEGV = """import ctypes
import os


def crash():
    ctypes.string_at(0)


if os.environ["RANK"] == "1":
    crash()
"""
ABORT = """import faulthandler
import os
import sys

print("faulthandler enabled:", faulthandler.is_enabled(), file=sys.stderr)
if os.environ["RANK"] == "1":
    os.abort()
"""


class Cgroup(NamedTuple):
    path: Path
    limit_file: str


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, fstype, super options) of this process's mounts."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        out.append((fields[4], fields[sep + 1], fields[sep + 3]))
    return out


def _make_cgroup(name: str) -> Cgroup:
    """A new memory cgroup with a limit of :data:`LIMIT_MIB` at the top of the memory
    hierarchy (v2 where it has the memory controller, else v1)."""
    limit = str(LIMIT_MIB << 20)
    for point, fstype, options in _mounts():
        subtree = Path(point, "cgroup.subtree_control")
        if fstype == "cgroup2" and subtree.exists() and "memory" in subtree.read_text().split():
            path = Path(point, name)
            path.mkdir()
            (path / "memory.max").write_text(limit)
            if (path / "memory.swap.max").exists():
                (path / "memory.swap.max").write_text("0")
            return Cgroup(path, "memory.max")
        if fstype == "cgroup" and "memory" in options.split(","):
            path = Path(point, name)
            path.mkdir()
            (path / "memory.limit_in_bytes").write_text(limit)
            if (path / "memory.swappiness").exists():
                (path / "memory.swappiness").write_text("0")
            return Cgroup(path, "memory.limit_in_bytes")
    raise OSError("no cgroup hierarchy with the memory controller is mounted")


@pytest.fixture
def cgroup() -> Iterator[Cgroup]:
    """A memory cgroup with a limit, removed at the end; skips (fails in CI) where this
    process cannot make one (not root, cgroups mounted read-only)."""
    if os.geteuid() != 0:
        unavailable("a memory cgroup with a limit needs root")
    try:
        made = _make_cgroup(f"unirank-test-{uuid.uuid4().hex[:8]}")
    except OSError as exc:
        unavailable(f"cannot make a memory cgroup with a limit here: {exc}")
    yield made
    made.path.rmdir()  # every process in it ended with the run


def _in(cgroup: Cgroup) -> list[str]:
    """The prefix that runs ``unirank run`` (and so its workers) in ``cgroup``."""
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup.path)]


def _summary(stderr: str) -> str:
    assert "unirank run: FAILED" in stderr, stderr
    return stderr[stderr.index("unirank run: FAILED"):]


def _peak_mib(summary: str) -> int:
    found = re.search(r"peak memory (\d+) MiB", summary)
    assert found, summary
    return int(found.group(1))


@PRELOAD
def test_a_worker_the_oom_killer_killed_is_named_so(runner: Runner, cgroup: Cgroup,
                                                     preload: list[str]) -> None:
    """Rank 1 allocates until the kernel's OOM killer kills it: the summary names the killer,
    the cgroup and its limit, and rank 1's peak memory."""
    runner.script("hog.py", HOG)
    result = runner.run(["-n", "2", *preload, "hog.py"], prefix=_in(cgroup))
    assert result.returncode == 137, result.stderr
    summary = _summary(result.stderr)
    assert summary.startswith(
        "unirank run: FAILED (exit code 137): rank 1 (local rank 1) on node "), summary
    assert (f": killed by the kernel's OOM killer (SIGKILL, signal 9; cgroup {cgroup.path}, "
            f"{cgroup.limit_file} {LIMIT_MIB} MiB); peak memory ") in summary, summary
    assert _peak_mib(summary) >= 100


@PRELOAD
def test_a_plain_kill_9_in_a_limited_cgroup_is_not_the_oom_killer(
        runner: Runner, cgroup: Cgroup, preload: list[str]) -> None:
    runner.script("kill9.py", KILL9)
    result = runner.run(["-n", "2", *preload, "kill9.py"], prefix=_in(cgroup))
    assert result.returncode == 137, result.stderr
    summary = _summary(result.stderr)
    assert (": killed by SIGKILL (signal 9), not by the OOM killer (its cgroup's memory.") in \
        summary, summary
    assert "killed by the kernel's OOM killer" not in summary
    assert _peak_mib(summary) > 0


@PRELOAD
def test_a_plain_kill_9_is_not_the_oom_killer(runner: Runner, preload: list[str]) -> None:
    """Wherever the run's cgroup is: no OOM named, the peak memory shown."""
    runner.script("kill9.py", KILL9)
    result = runner.run(["-n", "2", *preload, "kill9.py"])
    assert result.returncode == 137, result.stderr
    summary = _summary(result.stderr)
    assert ": killed by SIGKILL (signal 9)" in summary, summary
    assert "killed by the kernel's OOM killer" not in summary
    assert _peak_mib(summary) > 0


def _fault_block(summary: str) -> list[str]:
    """The lines of the summary's fault stack."""
    lines = summary.splitlines()
    start = lines.index("  Python stack of rank 1 at the fault (faulthandler):")
    block = []
    for line in lines[start + 1:]:
        if not line.startswith("    | "):
            break
        block.append(line[6:])
    return block


@PRELOAD
def test_a_segfault_shows_the_python_stack_at_the_fault(runner: Runner,
                                                        preload: list[str]) -> None:
    script = runner.script("segv.py", SEGV)
    result = runner.run(["-n", "2", *preload, "segv.py"])
    assert result.returncode == 139, result.stderr
    summary = _summary(result.stderr)
    assert "rank 1 (local rank 1) on node" in summary and "killed by SIGSEGV" in summary
    block = _fault_block(summary)
    assert block[0] == "Fatal Python error: Segmentation fault", summary
    assert f'  File "{script}", line 6 in crash' in block, summary
    assert f'  File "{script}", line 10 in <module>' in block, summary
    assert not any("unirank" in line or "runpy" in line for line in block), summary


@PRELOAD
def test_an_abort_shows_the_python_stack_and_faulthandler_looks_untouched_to_stderr(
        runner: Runner, preload: list[str]) -> None:
    """The stack goes to the worker's fault file, not to its stderr."""
    script = runner.script("abort.py", ABORT)
    result = runner.run(["-n", "2", *preload, "abort.py"])
    assert result.returncode == 134, result.stderr
    summary = _summary(result.stderr)
    assert "killed by SIGABRT" in summary
    assert f'  File "{script}", line 7 in <module>' in _fault_block(summary), summary
    before = result.stderr[:result.stderr.index("unirank run: FAILED")]
    assert "Fatal Python error" not in before, result.stderr


def test_the_program_s_own_faulthandler_is_kept(runner: Runner) -> None:
    """Under PYTHONFAULTHANDLER the interpreter's faulthandler writes to stderr, as without
    unirank; the summary shows that stack."""
    script = runner.script("abort.py", ABORT)
    result = runner.run(["-n", "2", "abort.py"], env={"PYTHONFAULTHANDLER": "1"})
    assert result.returncode == 134, result.stderr
    before = result.stderr[:result.stderr.index("unirank run: FAILED")]
    assert "Fatal Python error: Aborted" in before, result.stderr
    assert f'  File "{script}", line 7 in <module>' in _fault_block(_summary(result.stderr))


def test_the_fault_file_is_next_to_the_error_file(runner: Runner, tmp_path: Path) -> None:
    """torchrun's layout: ``<log_dir>/<run_id>_<random>/attempt_0/<local_rank>/fault.txt``,
left only where a fault wrote to it."""
    runner.script("segv.py", SEGV)
    logs = tmp_path / "logs"
    result = runner.run(["-n", "2", "--log-dir", str(logs), "--redirects", "3", "segv.py"])
    assert result.returncode == 139, result.stderr
    [folder] = logs.glob("*/attempt_0/1")
    assert (folder / "fault.txt").read_text().startswith(
        "Fatal Python error: Segmentation fault"), result.stderr
    assert (folder / "stderr.log").exists()
    [other] = logs.glob("*/attempt_0/0")
    assert not (other / "fault.txt").exists()  # an empty one is removed
