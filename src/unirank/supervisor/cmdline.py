"""A worker's command line as a fresh interpreter's: ``python3 train.py --lr 0.1``.

A worker forked from the fork server would show the server's command line
(``python3 -m unirank.supervisor.forkserver ...``), one started as its own interpreter the
bootstrap's (``python3 -m unirank.supervisor.bootstrap train.py ...``): ``ps``, ``top``,
``pgrep -f train.py``, ``pkill -f train.py`` and a cluster's process monitors would not find the
script. Before the worker's rendezvous, :func:`show_command_line` makes both read as
``torchrun`` would have started the worker, with the interpreter's path (``sys.executable``):

* ``sys.orig_argv`` becomes ``[sys.executable, SCRIPT, ARGS...]`` (or ``-m MODULE ARGS...``);
* what the kernel shows as the process's command line (``/proc/self/cmdline``, read by ``ps``
  and ``pgrep``) becomes the same arguments, NUL-separated. The kernel reads it from the
  memory range ``arg_start..arg_end`` of the process. First choice: a new buffer holding
  exactly these arguments, made that range with ``prctl(PR_SET_MM, PR_SET_MM_MAP)`` (no
  privilege needed since Linux 3.18 with ``CONFIG_CHECKPOINT_RESTORE``, which the common
  distributions' kernels have). Where the kernel refuses it, the arguments are written over the
  process's own range, the rest filled with NULs (``/proc/self/cmdline`` then ends with those
  NULs; ``ps`` and ``pgrep`` do not show them), and a command line longer than that range is
  cut to its length, its last byte a NUL: the interpreter, the script and the first arguments
  stay. A bootstrap's range always holds its worker's command line (it is that line plus
  ``-m unirank.supervisor.bootstrap``); a forked worker's is the server's.

``/proc/self/comm`` needs nothing: the server and the bootstrap are started as
``sys.executable``, as a fresh worker is. ``--exec`` (``--no-python``) replaces the process with
the program, whose command line is its own; a ``Parallel`` worker (``--call FILE``) runs a
function, not a command, and keeps its command line. Linux only: elsewhere nothing changes.

Reads: nothing from the environment.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Sequence

__all__ = ["fresh_argv", "overwrite_in_place", "show_command_line"]

_PR_SET_MM = 35
_PR_SET_MM_MAP = 14
#: the field numbers (1-based) of ``/proc/self/stat`` that ``struct prctl_mm_map`` takes
_STAT_FIELDS = {"start_code": 26, "end_code": 27, "start_stack": 28, "start_data": 45,
                "end_data": 46, "start_brk": 47, "arg_start": 48, "arg_end": 49,
                "env_start": 50, "env_end": 51}
#: the buffer the kernel reads the command line from, kept for the life of the process
_shown: list[ctypes.Array[ctypes.c_char]] = []


class _MmMap(ctypes.Structure):
    """``struct prctl_mm_map`` (linux/prctl.h)."""

    _fields_ = [(name, ctypes.c_uint64) for name in (
        "start_code", "end_code", "start_data", "end_data", "start_brk", "brk", "start_stack",
        "arg_start", "arg_end", "env_start", "env_end")] + [
        ("auxv", ctypes.c_void_p), ("auxv_size", ctypes.c_uint32), ("exe_fd", ctypes.c_uint32)]


def fresh_argv(target: Sequence[str], python: str | None = None) -> list[str] | None:
    """The command line a fresh interpreter running ``target`` (``SCRIPT ARGS`` or
    ``-m MODULE ARGS``) has; None for ``--exec`` and ``--call`` (see the module docstring)."""
    if not target or target[0] in ("--exec", "--call"):
        return None
    return [python or sys.executable, *target]


def _encoded(argv: Sequence[str]) -> bytes:
    return b"".join(arg.encode(errors="surrogateescape") + b"\0" for arg in argv)


def _stat_fields() -> dict[str, int]:
    with open("/proc/self/stat", encoding="ascii", errors="replace") as stat:
        values = stat.read().rsplit(")", 1)[1].split()
    return {name: int(values[number - 3]) for name, number in _STAT_FIELDS.items()}


def _remap(data: bytes) -> bool:
    """Make a new buffer holding ``data`` the kernel's command-line range; False if refused."""
    try:
        fields = _stat_fields()
        libc = ctypes.CDLL(None, use_errno=True)
    except (OSError, ValueError, IndexError):
        return False
    shown = ctypes.create_string_buffer(data, len(data))
    mm = _MmMap(**fields, auxv=None, auxv_size=0, exe_fd=0xFFFFFFFF)
    mm.arg_start = ctypes.addressof(shown)
    mm.arg_end = mm.arg_start + len(data)
    libc.sbrk.restype = ctypes.c_void_p
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                           ctypes.c_ulong]
    prctl = libc.prctl
    mm.brk = libc.sbrk(0) or 0  # read last: the kernel takes it as the heap's end
    if prctl(_PR_SET_MM, _PR_SET_MM_MAP, ctypes.byref(mm), ctypes.sizeof(mm), 0) != 0:
        return False
    _shown.append(shown)
    return True


def overwrite_in_place(data: bytes) -> bool:
    """Write ``data`` over the process's own command-line range, NUL-filled, cut to that range
    (its last byte a NUL) when longer; False when the range cannot be read."""
    try:
        fields = _stat_fields()
    except (OSError, ValueError, IndexError):
        return False
    start, end = fields["arg_start"], fields["arg_end"]
    size = end - start
    if size <= 0:
        return False
    fitted = data[:size - 1] + b"\0" if len(data) > size else data
    ctypes.memmove(start, fitted.ljust(size, b"\0"), size)
    return True


def show_command_line(target: Sequence[str]) -> None:
    """Make ``sys.orig_argv`` and the process's command line a fresh interpreter's running
    ``target`` (see the module docstring)."""
    argv = fresh_argv(target)
    if argv is None:
        return
    sys.orig_argv = argv
    if not sys.platform.startswith("linux"):
        return
    data = _encoded(argv)
    with contextlib.suppress(OSError):
        if not _remap(data):
            overwrite_in_place(data)
