"""The worker's faulthandler: the Python stack at a fatal signal, for the failure summary.

A worker that dies by SIGSEGV, SIGBUS, SIGABRT, SIGFPE or SIGILL leaves no traceback; the
supervisor shows the stack that :mod:`faulthandler` (C code that runs in the signal, no Python)
wrote at the fault instead (:func:`unirank.supervisor.deathcause.fault_stack`). The worker
enables it before the program runs, into its attempt folder's ``fault.txt`` (next to
``error.json``), through a descriptor of its own: opened close-on-exec (a program the worker
execs does not get it) and named by no variable the program sees.

The program's own choice wins: under ``PYTHONFAULTHANDLER`` or ``-X faulthandler`` the
interpreter enabled it already (to stderr), and it is left so; a program that calls
``faulthandler.enable()`` or ``disable()`` itself replaces this one. What the program can tell:
``faulthandler.is_enabled()`` answers True where a fresh interpreter answers False.

Runs in each worker.

Reads: no environment variable (the file's path comes in :class:`.info.WorkerInfo`).
"""

from __future__ import annotations

import faulthandler
import os

__all__ = ["catch_faults"]


def catch_faults(path: str) -> bool:
    """Have faulthandler write a fatal signal's stack (every thread's) to ``path``, unless it
    is on already or ``path`` is empty or cannot be opened; True when it now writes there."""
    if not path or faulthandler.is_enabled():
        return False
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    except OSError:
        return False
    faulthandler.enable(file=fd, all_threads=True)  # keeps the number: the fd stays open
    return True
