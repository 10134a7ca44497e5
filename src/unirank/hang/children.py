"""The stacks of a rank's forked child processes (its DataLoader workers), for the report.

A rank whose main thread waits for a DataLoader worker is stuck in that worker's code (its
dataset's ``__getitem__``), which the rank's own stacks do not show. So, once, before the
program starts, :func:`arm` registers :mod:`faulthandler` for :data:`STACK_SIGNAL` (a
real-time signal nothing else uses) writing to a pipe of this process: faulthandler's C
handler writes every thread's stack to that file descriptor and nothing else, and a child
forked later (DataLoader's workers, under the ``fork`` start method) inherits both. When the
watcher answers a stack request while the main thread waits for a worker, :func:`child_stacks`
sends the signal to each child whose signal mask shows the handler (``SigCgt`` in
``/proc/PID/status``: a child started by ``spawn`` has none, and would die of it), reads what
it wrote for at most :data:`READ_FOR` seconds, and parses it (:func:`parse_dump`, pure).

Linux only (``/proc``); elsewhere, or where faulthandler cannot register, no child stacks.
Reads no environment variable.
"""

from __future__ import annotations

import contextlib
import faulthandler
import linecache
import os
import re
import select
import signal
import time
from typing import Any

__all__ = ["READ_FOR", "STACK_SIGNAL", "arm", "child_stacks", "parse_dump"]

#: the signal a child's faulthandler dumps its stacks on (SIGRTMIN + 7 on Linux)
STACK_SIGNAL = int(getattr(signal, "SIGRTMIN", 34)) + 7
#: how long one child's dump is read, at most (seconds)
READ_FOR = 1.0
#: children asked, at most
MAX_CHILDREN = 4

_PIPE: list[int] = []  # [read end, write end] once armed

_FILE = re.compile(r'^\s+File "(?P<path>.*)", line (?P<line>\d+) in (?P<function>.*)$')


def arm() -> bool:
    """Register faulthandler for :data:`STACK_SIGNAL` on a pipe (once per process); False
    where it cannot be."""
    if _PIPE:
        return True
    if not os.path.isdir("/proc/self"):
        return False
    try:
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        faulthandler.register(STACK_SIGNAL, file=write_end, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError, AttributeError):
        return False
    _PIPE.extend((read_end, write_end))
    return True


def parse_dump(text: str) -> list[list[list[Any]]]:
    """faulthandler's text (``Thread 0x... (most recent call first):`` and ``  File "p",
    line N in f`` lines) as threads, each a stack outermost first (file, line, function, "")."""
    threads: list[list[list[Any]]] = []
    for line in text.splitlines():
        if line.startswith(("Thread ", "Current thread ")):
            threads.append([])
            continue
        found = _FILE.match(line)
        if found and threads:
            threads[-1].insert(0, [found["path"], int(found["line"]), found["function"], ""])
    return [t for t in threads if t]


def _children() -> list[int]:
    pids: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children", encoding="ascii") as fh:
                pids += [int(p) for p in fh.read().split()]
    return pids


def _catches(pid: int) -> bool:
    """Whether ``pid`` has a handler for :data:`STACK_SIGNAL` (inherited: it was forked)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (STACK_SIGNAL - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _read_dump(read_end: int) -> str:
    chunks: list[bytes] = []
    deadline = time.monotonic() + READ_FOR
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([read_end], [], [], min(left, 0.2 if chunks else left))
        if not ready:
            if chunks:
                break  # it wrote, then nothing more for 0.2 s: done
            continue
        with contextlib.suppress(BlockingIOError):
            chunks.append(os.read(read_end, 65536))
    return b"".join(chunks).decode(errors="replace")


def child_stacks() -> list[dict[str, Any]]:
    """Every armed child's threads, as the watcher's threads are (``name``, ``frames``)."""
    if not _PIPE:
        return []
    read_end = _PIPE[0]
    out: list[dict[str, Any]] = []
    for pid in [p for p in _children() if _catches(p)][:MAX_CHILDREN]:
        with contextlib.suppress(BlockingIOError, OSError):
            os.read(read_end, 1 << 20)  # what an earlier, late dump left
        try:
            os.kill(pid, STACK_SIGNAL)
        except OSError:
            continue
        for index, frames in enumerate(parse_dump(_read_dump(read_end))):
            for frame in frames:
                frame[3] = linecache.getline(frame[0], frame[1]).strip()
            out.append({"name": f"child process {pid}" + (f" thread {index}" if index else ""),
                        "ident": pid, "child": True, "frames": frames})
    return out
