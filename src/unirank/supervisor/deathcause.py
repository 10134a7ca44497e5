"""Why a worker died: the kernel's OOM killer behind a SIGKILL, and the Python stack a fatal
signal left.

Runs in the ``unirank run`` parent (no torch), read by :mod:`.engine`; never blocks and never
fails a run: what cannot be read is no evidence.

* **The OOM killer.** When the engine starts a worker it notes the worker's memory cgroup
  (:func:`memory_cgroup`: ``/proc/PID/cgroup`` and the mounts in ``/proc/self/mountinfo``) and
  the cgroup's count of OOM kills: ``oom_kill`` in ``memory.events`` (cgroup v2) or in
  ``memory.oom_control`` (v1). The kernel counts every OOM kill, the cgroup's limit's or the
  whole machine's, in the victim's own cgroup (v2: and its ancestors). A worker that died by
  SIGKILL, which the supervisor did not send, was killed by the OOM killer when that count rose
  (:func:`oom_verdict`); when no count can be read (no memory controller, the root cgroup), the
  kernel log (``/dev/kmsg``, where readable: root, or ``kernel.dmesg_restrict=0``) decides by its
  "Killed process PID" line. The limit named is the smallest ``memory.max`` /
  ``memory.limit_in_bytes`` from the worker's cgroup up to the root of its hierarchy.
* **A fatal signal's stack.** Each worker's faulthandler writes to its attempt folder's
  ``fault.txt`` (:mod:`.worker.faults`); :func:`fault_stack` reads the last dump, without the
  bootstrap's frames (from the worker's stderr instead when the program enabled faulthandler
  itself).

Reads: no environment variable; the files named above.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from unirank.signals import FAULT

__all__ = ["FAULT_HEAD", "FAULT_SIGNALS", "MemoryCgroup", "OomVerdict", "fault_stack",
           "kernel_log_lines", "memory_cgroup", "oom_killed_pids", "oom_verdict",
           "read_fault_file"]

#: the signals whose death shows faulthandler's stack
FAULT_SIGNALS = FAULT
#: a memory limit this large is no limit (cgroup v1 writes "unlimited" as 2**63 - page)
_NO_LIMIT = 1 << 60
#: the most kernel-log records read (the ring buffer holds a few thousand)
_MAX_RECORDS = 1 << 17
#: the most lines of a fault's stack shown
MAX_FAULT_LINES = 40
#: the first line of a faulthandler dump
FAULT_HEAD = "Fatal Python error"
_KILLED = re.compile(r"Killed process (\d+) ")
#: frames of the worker's bootstrap (not the user's): a forked worker's start in the fork
#: server, which runs through the helper's start (:mod:`unirank.supervisor.helper`)
_BOOTSTRAP_FRAMES = re.compile(r'File "(<frozen runpy>|[^"]*/runpy\.py|[^"]*/unirank/supervisor/'
                               r'((worker|fork)/[^"]*|helper\.py))"')

#: a frame of unirank's own threads in a worker (the hang watcher): not the program's
_OWN_THREAD_FRAMES = re.compile(r'File "[^"]*/unirank/hang/[^"]*"')

ReadText = Callable[[str], str]


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


@dataclass(frozen=True)
class MemoryCgroup:
    """A worker's memory cgroup as its start found it."""

    #: its folder (``/sys/fs/cgroup/...``)
    path: str
    #: 1 or 2
    version: int
    #: the mount point of its hierarchy (the limit search stops there)
    root: str
    #: its ``oom_kill`` count when the worker started
    oom_kills: int

    @property
    def events_file(self) -> str:
        """The file that counts its OOM kills."""
        return "memory.events" if self.version == 2 else "memory.oom_control"

    @property
    def limit_file(self) -> str:
        """The file that holds its memory limit."""
        return "memory.max" if self.version == 2 else "memory.limit_in_bytes"


def _mounts(mountinfo: str) -> Iterator[tuple[str, str, str, str]]:
    """(root, mount point, fstype, super options) of each mount in ``/proc/PID/mountinfo``."""
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 5 or len(fields) < sep + 4:
            continue
        yield fields[3], fields[4], fields[sep + 1], fields[sep + 3]


def _folder(mount: tuple[str, str], path: str) -> str:
    """The folder of cgroup ``path`` under a hierarchy mounted at ``mount`` (root, point)."""
    root, point = mount
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root):]
    return os.path.normpath(point + "/" + path.lstrip("/"))


def _candidates(cgroups: str, mountinfo: str) -> Iterator[tuple[int, str, str]]:
    """(version, folder, hierarchy's mount point) of the memory cgroup, v2 first."""
    v2 = v1 = None
    for line in cgroups.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hier == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    for root, point, fstype, options in _mounts(mountinfo):
        if fstype == "cgroup2" and v2 is not None:
            yield 2, _folder((root, point), v2), point
        elif fstype == "cgroup" and v1 is not None and "memory" in options.split(","):
            yield 1, _folder((root, point), v1), point


def _oom_kills(text: str) -> int | None:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def memory_cgroup(pid: int, *, proc: str = "/proc",
                  read_text: ReadText = _read) -> MemoryCgroup | None:
    """Process ``pid``'s memory cgroup and its OOM-kill count now; None where neither
    hierarchy counts them for it (no memory controller, the root cgroup, unreadable)."""
    try:
        cgroups = read_text(f"{proc}/{pid}/cgroup")
        mountinfo = read_text(f"{proc}/self/mountinfo")
    except OSError:
        return None
    for version, folder, root in _candidates(cgroups, mountinfo):
        name = "memory.events" if version == 2 else "memory.oom_control"
        try:
            count = _oom_kills(read_text(os.path.join(folder, name)))
        except OSError:
            continue
        if count is not None:
            return MemoryCgroup(folder, version, root, count)
    return None


def _limit(cgroup: MemoryCgroup, read_text: ReadText) -> tuple[str, int] | None:
    """The smallest memory limit from ``cgroup`` up to its hierarchy's root: (folder, bytes)."""
    best = None
    folder = cgroup.path
    while True:
        with contextlib.suppress(OSError, ValueError):
            value = int(read_text(os.path.join(folder, cgroup.limit_file)).strip())
            if value < _NO_LIMIT and (best is None or value < best[1]):
                best = (folder, value)
        if folder == cgroup.root or len(folder) <= len(cgroup.root):
            return best
        folder = os.path.dirname(folder)


def kernel_log_lines(since: float = 0.0, path: str = "/dev/kmsg") -> list[str] | None:
    """The kernel log's messages from ``since`` on (``time.monotonic()``'s clock, the log's:
    seconds since boot), read without blocking; None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    lines: list[str] = []
    try:
        for _ in range(_MAX_RECORDS):
            try:
                record = os.read(fd, 8192)
            except BrokenPipeError:  # a record was overwritten while reading: go on
                continue
            except OSError:  # EAGAIN: the end
                break
            if not record:
                break
            head, _, message = record.decode("utf-8", errors="replace").partition(";")
            stamp = head.split(",")
            if len(stamp) > 2 and stamp[2].isdigit() and int(stamp[2]) < since * 1e6:
                continue  # before the worker started: an older process with the same pid
            lines.append(message)
    finally:
        os.close(fd)
    return lines


def oom_killed_pids(lines: Iterable[str]) -> set[int]:
    """The pids that kernel log ``lines`` say the OOM killer killed."""
    return {int(m.group(1)) for line in lines if (m := _KILLED.search(line))}


@dataclass(frozen=True)
class OomVerdict:
    """Whether the OOM killer killed a worker, and what says so."""

    killed: bool
    #: what decided: "its cgroup's memory.events", "the kernel log"
    evidence: str
    #: the worker's memory cgroup (None: not known)
    cgroup: str | None = None
    #: the limit that applied: its file, the cgroup that set it, and bytes (None: no limit)
    limit_file: str = ""
    limit_cgroup: str | None = None
    limit: int | None = None


def oom_verdict(pid: int, cgroup: MemoryCgroup | None, *, since: float = 0.0,
                read_text: ReadText = _read,
                kernel_log: Callable[[float], Iterable[str] | None] = kernel_log_lines,
                ) -> OomVerdict | None:
    """Whether worker ``pid``, dead by a SIGKILL nobody here sent, was the OOM killer's victim
    (``cgroup``: its memory cgroup as it started; ``since``: when it started, by
    ``time.monotonic()``); None when nothing can tell."""
    if cgroup is not None:
        with contextlib.suppress(OSError):
            count = _oom_kills(read_text(os.path.join(cgroup.path, cgroup.events_file)))
            if count is not None:
                limit = _limit(cgroup, read_text)
                return OomVerdict(
                    count > cgroup.oom_kills, f"its cgroup's {cgroup.events_file}",
                    cgroup.path, cgroup.limit_file, limit[0] if limit else None,
                    limit[1] if limit else None)
    lines = kernel_log(since)
    if lines is None:
        return None
    return OomVerdict(pid in oom_killed_pids(lines), "the kernel log")


def _without_own_threads(lines: list[str]) -> list[str]:
    """``lines`` of a dump without the blocks of unirank's own threads (a thread other than
    the one that faulted whose frames are unirank's hang watcher)."""
    blocks: list[list[str]] = [[]]
    for line in lines:
        if line.startswith(("Current thread", "Thread ")):
            blocks.append([])
        blocks[-1].append(line)
    return [line for block in blocks
            if not (block[:1] and block[0].startswith("Thread ")
                    and any(_OWN_THREAD_FRAMES.search(line) for line in block))
            for line in block]


def fault_stack(text: str, max_lines: int = MAX_FAULT_LINES) -> list[str]:
    """The last faulthandler dump in ``text``: its "Fatal Python error" line, then each thread
    with Python frames and its frames, without the bootstrap's, unirank's own threads, blank
    lines and the list of extension modules."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(FAULT_HEAD)]
    if not starts:
        return []
    out: list[str] = []
    header: str | None = None
    for line in _without_own_threads(lines[starts[-1]:]):
        if not line.strip() or line.startswith("Extension modules:"):
            continue
        if line.startswith(("Current thread", "Thread ")):
            header = line
        elif line.startswith("  File ") or line.strip() == "<no Python frame>":
            if line.startswith("  File ") and not _BOOTSTRAP_FRAMES.search(line):
                if header is not None:
                    out.append(header)
                    header = None
                out.append(line)
        else:
            out.append(line)
    return out if len(out) <= max_lines else [*out[:max_lines - 1], "  ..."]


def read_fault_file(path: str | None) -> list[str]:
    """:func:`fault_stack` of the worker's fault file ([] when absent or unreadable)."""
    if not path:
        return []
    try:
        return fault_stack(_read(path))
    except OSError:
        return []
