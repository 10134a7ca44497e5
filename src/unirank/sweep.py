"""What runs leave in the temporary folder, and the sweep that removes what nobody needs.

A run puts four kinds of entries in the temporary folder (:func:`tempfile.gettempdir`):

- ``unirank-run-XXXX/``: the run's folder where no ``--log-dir`` was given
  (:mod:`unirank.supervisor.attempts`); owned by the launcher (``unirank run``);
- ``unirank-rdzv-XXXX/``: the c10d rendezvous helper's log (``helper.log``,
  :mod:`unirank.supervisor.rdzv.client`); owned by the launcher;
- ``unirank-parallel-XXXX/``: a call's pickle and results of ``Parallel``/``ur.launch``
  (:mod:`unirank.runtime.parallel`); owned by the calling process;
- ``unirank-<uid>/<run id>.<pid>.json``: the job files of ``unirank stacks``
  (:mod:`unirank.hang.jobs`); owned by the worker that wrote one.

and one in the shared memory folder (``/dev/shm``, :mod:`unirank.statekeep.memory`):

- ``unirank-state-XXXX/``: the node's snapshots of the job's state; owned by the launcher
  (never a report: swept as soon as its owner is gone).

Each folder holds ``owner.json`` and each job file its owner's fields: the owner named
uniquely across PID namespaces and reboots (:mod:`unirank.owner`).

What is removed, and when, is the rule of :func:`unirank.owner.should_sweep`.

Reads: TMPDIR (through :func:`tempfile.gettempdir`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from typing import Any

from unirank.hang.jobs import sweep_jobs
from unirank.owner import DEAD, Here, here, owner_of, should_sweep, state_of_record

__all__ = ["BOOKKEEPING", "EVICTED_FILE", "OWNER_FILE", "PARALLEL_PREFIX", "PREFIXES",
           "RDZV_PREFIX", "RUN_PREFIX", "SLOW_LINK_FILE", "SPARES_FILE", "STATE_PREFIX",
           "make_owned_folder", "read_owner", "sweep"]

#: the owner's record in an owned folder
OWNER_FILE = "owner.json"
#: a run's temporary folder's name prefix (:mod:`unirank.runfolder`)
RUN_PREFIX = "unirank-run-"
#: the rendezvous helper's log folder's (:mod:`unirank.supervisor.rdzv.client`)
RDZV_PREFIX = "unirank-rdzv-"
#: a call's folder of :class:`unirank.runtime.parallel.Parallel` (its pickle, its results:
#: nothing to read once its owner is gone)
PARALLEL_PREFIX = "unirank-parallel-"
#: the node's snapshot memory's (:mod:`unirank.statekeep.memory`), in the shared memory folder
STATE_PREFIX = "unirank-state-"
#: the owned folders' name prefixes, in the temporary folder
PREFIXES = (RUN_PREFIX, RDZV_PREFIX, PARALLEL_PREFIX)
#: the owned folders of which nothing is ever kept to be read once the owner is gone
_NEVER_REPORTS = (PARALLEL_PREFIX, STATE_PREFIX)


def make_owned_folder(prefix: str, where: str | None = None) -> str:
    """A new folder ``<where>/<prefix>XXXX`` (default: the temporary folder) with this
    process's :data:`OWNER_FILE`; its path. OSError where it cannot be made."""
    path = tempfile.mkdtemp(prefix=prefix, dir=where)
    record = os.path.join(path, OWNER_FILE)
    with open(f"{record}.tmp", "w", encoding="utf-8") as fh:
        json.dump(owner_of().to_record(), fh)
    os.replace(f"{record}.tmp", record)
    return path


def read_owner(folder: str) -> dict[str, Any] | None:
    """The owner record of an owned folder; None where it has none (or it is unreadable)."""
    with contextlib.suppress(OSError, ValueError), \
            open(os.path.join(folder, OWNER_FILE), encoding="utf-8") as fh:
        data = json.load(fh)
        return data if isinstance(data, dict) else None
    return None


#: a run folder's count of the spare nodes waiting (:attr:`unirank.runfolder.RunFolder.
#: spares_file`): the run's bookkeeping, never a report
SPARES_FILE = "spares"
#: a run folder's record of the last eviction (:attr:`unirank.runfolder.RunFolder.
#: evicted_file`): the run's bookkeeping, never a report
EVICTED_FILE = "evicted.json"
#: a run folder's record of the node whose link the rendezvous names slow now
#: (:attr:`unirank.runfolder.RunFolder.slow_link_file`): the run's bookkeeping, never a report
SLOW_LINK_FILE = "slow-link"
#: the files of a run folder (beside its owner record) that are its bookkeeping, not attempts
BOOKKEEPING = frozenset({SPARES_FILE, EVICTED_FILE, SLOW_LINK_FILE})


def _holds_report(folder: str) -> bool:
    """Whether an owned folder holds something to read: a file that is not empty (a hang
    report, a worker's error file or log, the rendezvous helper's log), its owner record and
    the run's bookkeeping (:data:`BOOKKEEPING`) aside."""
    for top, _, names in os.walk(folder):
        for name in names:
            if top == folder and (name.startswith(OWNER_FILE) or name in BOOKKEEPING):
                continue  # the run's own bookkeeping: nothing to read
            with contextlib.suppress(OSError):
                if os.path.getsize(os.path.join(top, name)) > 0:
                    return True
    return False


def _sweep_folder(path: str, spot: Here, now: float) -> bool:
    """Remove one owned folder where :func:`should_sweep` says so; whether it was removed."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    if info.st_uid != os.getuid():
        return False  # another user's: theirs to sweep
    record = read_owner(path)
    state = None if record is None else state_of_record(record, spot)
    holds = (state == DEAD and not os.path.basename(path).startswith(_NEVER_REPORTS)
             and _holds_report(path))  # asked only where the answer counts
    if not should_sweep(state, holds, now - info.st_mtime):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.exists(path)


def _sweep_in(folder: str, prefixes: tuple[str, ...], spot: Here, now: float) -> list[str]:
    """Sweep the owned folders named with ``prefixes`` in ``folder``; the paths removed."""
    removed: list[str] = []
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if (name.startswith(prefixes) and os.path.isdir(path)
                    and not os.path.islink(path) and _sweep_folder(path, spot, now)):
                removed.append(path)
    return removed


def sweep(now: float | None = None, tmp: str | None = None,
          shm: str | None = None) -> list[str]:
    """Remove from the temporary folder (``tmp``, default this process's) and from ``shm``
    (where runs make their snapshot memory, :func:`unirank.statekeep.memory.memory_root`;
    None: not looked at) what the rule (:func:`unirank.owner.should_sweep`) says nobody
    needs: this user's owned folders and job files; the paths removed. ``now``: the time to
    measure ages from (default: now)."""
    now = time.time() if now is None else now
    spot = here()
    tmp = tmp or tempfile.gettempdir()
    removed = _sweep_in(tmp, PREFIXES, spot, now)
    if shm is not None:
        removed += _sweep_in(shm, (STATE_PREFIX,), spot, now)
    return removed + sweep_jobs(spot, tmp)
