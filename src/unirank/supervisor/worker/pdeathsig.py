"""Make a process die with its parent: ``prctl(PR_SET_PDEATHSIG)`` on Linux.

Workers that ``unirank run`` starts call :func:`die_with_parent` first thing, so that a parent
killed with SIGKILL (which can neither forward nor clean up) takes its workers with it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from unirank.exitcodes import killed_by

__all__ = ["PR_SET_PDEATHSIG", "die_with_parent", "set_parent_death_signal"]

#: from <linux/prctl.h>
PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent thread exits.

    Returns False where the call is not available (not Linux, or prctl failed).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return False
    prctl.restype = ctypes.c_int
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return int(prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0


def die_with_parent(expected_parent: int, sig: int = signal.SIGKILL) -> bool:
    """Arm the parent-death signal, then close the race with a parent that already died.

    The parent may have died between our ``fork`` and the ``prctl`` call; we would then have been
    re-parented already and the signal would never come. So after arming, compare ``getppid()``
    with ``expected_parent`` and exit at once (by ``sig``) when they differ.

    Returns whether the signal was armed (False where prctl is unavailable).
    """
    armed = set_parent_death_signal(sig)
    if os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)
        os._exit(killed_by(sig))  # pragma: no cover - only if sig is caught or ignored
    return armed
