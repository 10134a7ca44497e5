"""A cgroup v1 CPU quota for one process of a test (a slow node, as the shared facts say):
made under ``/sys/fs/cgroup/cpu``, the process moved back to the root group and the group
removed after; and a favoured group for the process the test compares it with (its "full
speed" one), which the scheduler then serves before the other tests' processes: where CI runs
more test processes than cores, a process of the root group gets a share of a CPU only, the
slow one would then be slow against nobody, and the test would wait on the machine's load.
Where this machine has no cgroup v1 CPU controller, the test is unavailable
(a failure in CI: :func:`_procs.unavailable`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

from _procs import unavailable

CPU = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100000


def make_group(quota_us: int, name: str = "") -> Path:
    """A new group allowed ``quota_us`` of each period of 100 ms."""
    group = CPU / f"unirank-test-{os.getpid()}{name}"
    try:
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(quota_us))
    except OSError as exc:
        unavailable(f"no cgroup v1 CPU quota here ({exc})")
    return group


#: the weight of a favoured group: ten processes' (each process of the root group weighs 1024)
FAVOURED_SHARES = 10240


def favoured_group(name: str = "-favoured") -> Path:
    """A new group the scheduler weighs as ten plain processes (no quota)."""
    group = CPU / f"unirank-test-{os.getpid()}{name}"
    try:
        group.mkdir()
        (group / "cpu.shares").write_text(str(FAVOURED_SHARES))
    except OSError as exc:
        unavailable(f"no cgroup v1 CPU weights here ({exc})")
    return group


def move(group: Path, pid: int) -> None:
    """Put process ``pid`` in ``group`` (its children to come are born there)."""
    (group / "cgroup.procs").write_text(str(pid))


def move_tree(group: Path, pids: Iterable[int]) -> None:
    """Put each of ``pids`` still running in ``group`` (a process tree: one that ended is
    left out)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            move(group, pid)


def release(group: Path) -> None:
    """Every process of ``group`` back to the root group (where it still runs), then remove
    the group."""
    with contextlib.suppress(OSError):
        members = (group / "cgroup.procs").read_text().split()
        for pid in members:
            with contextlib.suppress(OSError):  # it ended
                (CPU / "cgroup.procs").write_text(pid)
    group.rmdir()
