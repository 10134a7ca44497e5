"""Where a running job's store is, for ``unirank stacks`` in another shell of the same node.

The hang watcher of each node's first local rank writes ``<tmp>/unirank-<uid>/<run id>.<pid>.json``
(the run id, the store's address and port, the world size, the watcher's interval, and its
owner: the writer named uniquely across PID namespaces, :mod:`unirank.owner`) when it starts,
and removes it when it stops. Each writer has a file of its own, so that where several
processes of a node are its first local rank (``--virtual-local-rank``: every worker sees
``LOCAL_RANK=0``) the first to end does not hide the job from the others; :func:`scan_jobs`
gives each run id once. A file whose owner is provably gone (a rank killed by a signal cannot
remove it) is stale: :func:`scan_jobs` and :func:`sweep_jobs` (every ``unirank run``'s start
and end, :mod:`unirank.sweep`) remove it. A file whose owner cannot be checked here (written in
another PID namespace: a container) is neither removed nor taken as a running job: it is
"unchecked". A file is written whole or not at all (a ``.json.tmp`` renamed into place); a
``.json.tmp`` left by a writer killed while it wrote (its pid in its name) is swept by the
same rule, with its pid alone as its owner.

Each file also names the process that runs the node's attempts (``supervisor``:
:func:`supervisor_of`), so that ``unirank top`` tells a job that restarts from one that ended.

Reads: TMPDIR (through :func:`tempfile.gettempdir`).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Mapping
from typing import Any

from unirank.owner import (
    ALIVE,
    DEAD,
    Here,
    Owner,
    OwnerState,
    here,
    owner_of,
    should_sweep,
    state_of_record,
)

__all__ = ["announce", "find_jobs", "jobs_dir", "scan_jobs", "supervisor_gone", "supervisor_of",
           "sweep_jobs", "withdraw"]


#: a job file's name ends with it; :data:`UNFINISHED` after it while it is written
SUFFIX = ".json"
UNFINISHED = ".tmp"


def jobs_dir(tmp: str | None = None) -> str:
    """This user's folder of job files, in ``tmp`` (default: the temporary folder)."""
    return os.path.join(tmp or tempfile.gettempdir(), f"unirank-{os.getuid()}")


def _safe(run_id: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in run_id) or "job"


def announce(job: Mapping[str, Any]) -> str | None:
    """Write ``job``'s file for this process (atomically) with this process named as its owner
    (:func:`unirank.owner.owner_of`) and its supervisor (:func:`supervisor_of` of the job's
    ``supervisor_pid``) as ``supervisor``; its path, or None where it cannot."""
    folder = jobs_dir()
    path = os.path.join(folder, f"{_safe(str(job['run_id']))}.{os.getpid()}{SUFFIX}")
    record = {**{k: v for k, v in job.items() if k != "supervisor_pid"},
              **owner_of().to_record(),
              "supervisor": supervisor_of(job.get("supervisor_pid")).to_record()}
    for _ in range(2):  # a sweep may remove the empty folder between makedirs and open
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            temporary = f"{path}{UNFINISHED}"
            with open(temporary, "w", encoding="utf-8") as fh:
                json.dump(record, fh)
            os.replace(temporary, path)
        except FileNotFoundError:
            continue
        except OSError:
            return None
        return path
    return None


def supervisor_of(pid: int | None) -> Owner:
    """The process that runs this one's attempts: ``pid`` where the caller knows it (a ``unirank
    run`` worker: its UNIRANK_SUPERVISOR_PID, which the worker's info read before the
    variable was scrubbed), else the parent (torchrun's agent, ``Parallel``'s caller). It
    outlives the attempts: the job runs on on this node while it runs."""
    return owner_of(pid if pid else os.getppid())


def supervisor_gone(record: Mapping[str, Any], spot: Here | None = None) -> bool:
    """Whether the supervisor a job file names (:func:`supervisor_of`) is provably gone:
    the job ended on this node (no next attempt comes); False where unknown."""
    named = record.get("supervisor")
    return isinstance(named, Mapping) and state_of_record(named, spot) == DEAD


def withdraw(path: str | None) -> None:
    """Remove a job file this process wrote (unless another process has replaced it)."""
    if not path:
        return
    with contextlib.suppress(OSError, ValueError), open(path, encoding="utf-8") as fh:
        if json.load(fh).get("pid") == os.getpid():
            os.unlink(path)


def _records(spot: Here, folder: str | None = None) -> list[tuple[str, dict[str, Any],
                                                                   OwnerState]]:
    """Every job file's run id, contents and owner state (in ``folder``, default
    :func:`jobs_dir`); the files that :func:`unirank.owner.should_sweep` gives up (their owner
    provably gone; an unfinished file's writer gone) are removed instead."""
    folder = folder or jobs_dir()
    now = time.time()
    found = []
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            with contextlib.suppress(OSError):
                if name.endswith(SUFFIX + UNFINISHED):  # its writer known by its pid alone
                    data, state = None, state_of_record({"pid": _writer_pid(name)}, spot)
                elif name.endswith(SUFFIX):
                    data = _load(path)
                    state = state_of_record(data, spot) if data is not None else None
                else:
                    continue
                if should_sweep(state, False, now - os.stat(path).st_mtime):
                    os.unlink(path)
                elif data is not None and state is not None:  # else no job (gone once old)
                    found.append((str(data.get("run_id", "")), data, state))
    return found


def _load(path: str) -> dict[str, Any] | None:
    """A job file's record; None where it holds no JSON object."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _writer_pid(name: str) -> str:
    """The pid in an unfinished file's name (``<run id>.<pid>.json.tmp``). A writer of another
    PID namespace may be taken for gone and its file removed: its rename then fails and it
    writes again (:func:`announce`)."""
    return name[:-len(SUFFIX + UNFINISHED)].rpartition(".")[2]


def _matches(run_id: str, job: str | None) -> bool:
    return job is None or run_id == job or run_id.startswith(f"{job}.")


def scan_jobs(job: str | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The running jobs of this node (their files' contents) and the unchecked ones (written in
    another PID namespace, or by an older unirank whose pid still runs), each once per run id,
    by run id; with ``job``, those whose run id is it or starts with ``job.`` (a Slurm job id
    without its step). Stale files are removed."""
    live: dict[str, dict[str, Any]] = {}
    unchecked: dict[str, dict[str, Any]] = {}
    for run_id, data, state in _records(here()):
        if _matches(run_id, job):
            (live if state == ALIVE else unchecked).setdefault(run_id, data)
    return list(live.values()), [d for r, d in unchecked.items() if r not in live]


def find_jobs(job: str | None = None) -> list[dict[str, Any]]:
    """The running jobs of this node (:func:`scan_jobs`'s first list)."""
    return scan_jobs(job)[0]


def sweep_jobs(spot: Here | None = None, tmp: str | None = None) -> list[str]:
    """Remove the job files whose owner is provably gone, and the folder once it is empty;
    the paths removed. ``tmp``: the temporary folder to sweep (default: this process's)."""
    folder = jobs_dir(tmp)
    before = set(_names(folder))
    _records(spot or here(), folder)
    removed = [os.path.join(folder, n) for n in sorted(before - set(_names(folder)))]
    with contextlib.suppress(OSError):
        os.rmdir(folder)  # only where empty (an announce that loses this race writes again)
        removed.append(folder)
    return removed


def _names(folder: str) -> list[str]:
    with contextlib.suppress(OSError):
        return os.listdir(folder)
    return []
