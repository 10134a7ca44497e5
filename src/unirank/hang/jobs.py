"""Where a running job's store is, for ``unirank stacks`` in another shell of the same node.

The hang watcher of each node's first local rank writes ``<tmp>/unirank-<uid>/<run id>.<pid>.json``
(the run id, the store's address and port, the world size, the watcher's interval, its pid)
when it starts, and removes it when it stops. Each writer has a file of its own, so that where
several processes of a node are its first local rank (``--virtual-local-rank``: every worker
sees ``LOCAL_RANK=0``) the first to end does not hide the job from the others; :func:`find_jobs`
gives each run id once. A file whose pid is gone (a rank killed by a signal cannot remove it) is
stale, and :func:`find_jobs` removes it.

Reads: TMPDIR (through :func:`tempfile.gettempdir`).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any

__all__ = ["announce", "find_jobs", "jobs_dir", "withdraw"]


def jobs_dir() -> str:
    """This user's folder of job files."""
    return os.path.join(tempfile.gettempdir(), f"unirank-{os.getuid()}")


def _safe(run_id: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in run_id) or "job"


def announce(job: Mapping[str, Any]) -> str | None:
    """Write ``job``'s file for this process (atomically) with this pid; its path, or None
    where it cannot."""
    folder = jobs_dir()
    path = os.path.join(folder, f"{_safe(str(job['run_id']))}.{os.getpid()}.json")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        temporary = f"{path}.tmp"
        with open(temporary, "w", encoding="utf-8") as fh:
            json.dump({**job, "pid": os.getpid()}, fh)
        os.replace(temporary, path)
    except OSError:
        return None
    return path


def withdraw(path: str | None) -> None:
    """Remove a job file this process wrote (unless another process has replaced it)."""
    if not path:
        return
    with contextlib.suppress(OSError, ValueError), open(path, encoding="utf-8") as fh:
        if json.load(fh).get("pid") == os.getpid():
            os.unlink(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def find_jobs(job: str | None = None) -> list[dict[str, Any]]:
    """The running jobs of this node (their files' contents), once per run id, by run id; with
    ``job``, those whose run id is it or starts with ``job.`` (a Slurm job id without its step).
    Stale files are removed."""
    found: dict[str, dict[str, Any]] = {}
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(jobs_dir())):
            if not name.endswith(".json"):
                continue
            with contextlib.suppress(OSError, ValueError):
                with open(os.path.join(jobs_dir(), name), encoding="utf-8") as fh:
                    data = json.load(fh)
                run_id = str(data.get("run_id", ""))
                if not _alive(int(data.get("pid", 0)) or -1):
                    os.unlink(os.path.join(jobs_dir(), name))
                    continue
                if job is None or run_id == job or run_id.startswith(f"{job}."):
                    found.setdefault(run_id, data)
    return list(found.values())
