"""A cgroup v1 CPU quota for one process of a test (a slow node, as the shared facts say):
made under ``/sys/fs/cgroup/cpu``, the process moved back to the root group and the group
removed after. Where this machine has no cgroup v1 CPU controller, the test is unavailable
(a failure in CI: :func:`_procs.unavailable`)."""

from __future__ import annotations

import contextlib
import os
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


def move(group: Path, pid: int) -> None:
    """Put process ``pid`` in ``group``."""
    (group / "cgroup.procs").write_text(str(pid))


def release(group: Path, pid: int) -> None:
    """Back to the root group (where the process still runs), then remove the group."""
    if pid:
        with contextlib.suppress(OSError):  # it ended
            (CPU / "cgroup.procs").write_text(str(pid))
    group.rmdir()
