"""Who owns what a run leaves in the temporary folder, and whether that owner still runs.

A pid alone does not name a process: the kernel gives it again to a later process, and a pid
written inside a PID namespace (a container whose PID 1 is ``unirank run``) means another
process, or none, outside it. An :class:`Owner` names one process so that no other has the
same name, on this node, in any namespace, before or after a reboot:

- ``pid``: as the process saw itself (``os.getpid()``);
- ``start``: its start time, in clock ticks after boot (field 22 of ``/proc/<pid>/stat``): a
  pid given again belongs to a process that started later;
- ``pidns``: its PID namespace (``/proc/self/ns/pid``, e.g. ``pid:[4026531836]``): its pid
  is checked only by a process of the same namespace;
- ``boot``: the kernel's boot id (``/proc/sys/kernel/random/boot_id``, the same in every
  container of a kernel): after a reboot (a node that crashed), no owner of before runs;
- ``host``: the host name, for a temporary folder that several machines share (compared
  only where the boot ids differ: one kernel's containers may have host names of their own).

:func:`owner_state` (pure) says ALIVE, DEAD (provably gone) or UNKNOWN (another namespace
or machine, or a record of an older unirank that holds only a pid that still runs); only a
DEAD owner's files may be removed, and only an ALIVE one is a running job
(:mod:`unirank.hang.jobs`, :mod:`unirank.sweep`). Without ``/proc`` (not Linux) the identity
is empty and a record is checked by its pid alone: gone is DEAD, else UNKNOWN.

When what an owner left may go (:func:`should_sweep`: the rule's one home, told in
docs/architecture.md and docs/troubleshooting.md; the entries: :mod:`unirank.sweep`):

1. A run removes its own entries when it ends: normally, failed, after restarts, on Ctrl-C or
   SIGTERM. It keeps a folder that holds something to read after the run, and names its path:
   a hang report; the log files of ``--redirects``/``--tee`` without ``--log-dir``; the
   rendezvous helper's log when the helper failed (and not empty).
2. What a run could not remove (its launcher SIGKILLed, scancel, a node that crashed) is
   swept when a ``unirank run`` starts or ends on the node (:func:`unirank.sweep.sweep`): an
   entry goes when its owner is provably dead and nothing in it is to read (no file that is
   not empty, the owner record aside); when its owner is dead and it is :data:`KEEP_DAYS`
   days past its last change; or, without an owner record (a folder of an older unirank, or
   one being made this instant), :data:`KEEP_DAYS` days past its last change. An owner that
   runs, or that cannot be checked (another PID namespace, another machine sharing the
   folder), keeps everything of its own.

Reads no environment variable.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["ALIVE", "DEAD", "KEEP_DAYS", "NO_START", "UNKNOWN", "Here", "Owner", "OwnerState",
           "here", "owner_of", "owner_state", "seen_start", "should_sweep", "state_of_record"]

OwnerState = Literal["alive", "dead", "unknown"]
ALIVE: OwnerState = "alive"
DEAD: OwnerState = "dead"
UNKNOWN: OwnerState = "unknown"

#: days a dead run's folder with something to read in it is kept
KEEP_DAYS = 7.0
#: what :func:`seen_start` says of a pid that runs but whose start time cannot be read
NO_START = -1


@dataclass(frozen=True)
class Owner:
    """One process, named uniquely (see the module docstring); "" / -1: not known."""

    pid: int
    start: int = NO_START
    pidns: str = ""
    boot: str = ""
    host: str = ""

    def to_record(self) -> dict[str, Any]:
        """The owner as a JSON object's fields."""
        return asdict(self)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Owner | None:
        """The owner a record names (a record of an older unirank: its pid only); None
        where it names none."""
        try:
            pid = int(record.get("pid") or 0)
            start = int(record.get("start", NO_START))
        except (TypeError, ValueError):
            return None
        if pid <= 0:
            return None
        return cls(pid, start, str(record.get("pidns", "")), str(record.get("boot", "")),
                   str(record.get("host", "")))


@dataclass(frozen=True)
class Here:
    """Where a record is checked: this process's namespace, boot id and host name."""

    pidns: str
    boot: str
    host: str


def owner_state(owner: Owner, here: Here, seen: int | None) -> OwnerState:
    """Whether ``owner`` still runs, checked ``here``, where the process with its pid has
    start time ``seen`` (None: no process has that pid here; :data:`NO_START`: one has, its
    start time unreadable). Pure."""
    same_kernel = bool(owner.boot and here.boot and owner.boot == here.boot)
    if not same_kernel and owner.host and here.host and owner.host != here.host:
        return UNKNOWN  # another machine's: its pid means nothing here
    if owner.boot and here.boot and owner.boot != here.boot:
        return DEAD  # this kernel booted since: nothing of before runs
    if not owner.pidns or not here.pidns or owner.start == NO_START:
        return DEAD if seen is None else UNKNOWN  # a pid alone proves only its absence
    if owner.pidns != here.pidns:
        return UNKNOWN  # another PID namespace (a container): its pid is not ours to check
    if seen is None:
        return DEAD
    if seen == NO_START:
        return UNKNOWN
    return ALIVE if seen == owner.start else DEAD  # else the pid was given again


def should_sweep(state: OwnerState | None, holds_report: bool, age_s: float,
                 keep_days: float = KEEP_DAYS) -> bool:
    """Whether an entry of the temporary folder is removed: its owner's ``state`` (None: no
    owner record), whether it ``holds_report`` (something to read), and ``age_s`` seconds
    since its last change. Pure (the rule: the module docstring)."""
    old = age_s >= keep_days * 86400.0
    if state is None:
        return old
    return state == DEAD and (old or not holds_report)


def _read(path: str) -> str:
    with contextlib.suppress(OSError), open(path, encoding="ascii", errors="replace") as fh:
        return fh.read().strip()
    return ""


def seen_start(pid: int) -> int | None:
    """The start time of the process ``pid`` of this namespace (clock ticks after boot); None
    where none runs (a zombie has ended: it runs no more); :data:`NO_START` where one runs
    whose start time cannot be read."""
    stat = _read(f"/proc/{pid}/stat")
    if stat:
        with contextlib.suppress(IndexError, ValueError):
            fields = stat.rsplit(")", 1)[1].split()  # after the name: field 3 on
            return None if fields[0] in ("Z", "X") else int(fields[19])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except (PermissionError, OverflowError):
        return NO_START
    return NO_START


def _pidns() -> str:
    with contextlib.suppress(OSError):
        return os.readlink("/proc/self/ns/pid")
    return ""


def here() -> Here:
    """This process's namespace, the kernel's boot id and the host name."""
    return Here(_pidns(), _read("/proc/sys/kernel/random/boot_id"), socket.gethostname())


def owner_of(pid: int | None = None) -> Owner:
    """This process (or the process ``pid`` of this namespace), named uniquely (see the
    module docstring)."""
    pid = os.getpid() if pid is None else pid
    spot = here()
    start = seen_start(pid) if spot.pidns else None
    return Owner(pid, NO_START if start is None else start, spot.pidns, spot.boot, spot.host)


def state_of_record(record: Mapping[str, Any], spot: Here | None = None) -> OwnerState | None:
    """The state of the owner that ``record`` names, checked in this process's namespace
    (``spot``: :func:`here`'s, given when many are checked); None where it names none."""
    owner = Owner.from_record(record)
    if owner is None:
        return None
    spot = spot or here()
    other = bool(owner.pidns and spot.pidns and owner.pidns != spot.pidns)
    seen = None if other else seen_start(owner.pid)  # another namespace's pid: not probed
    return owner_state(owner, spot, seen)
