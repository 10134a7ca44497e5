"""A worker's command line and environment block as a fresh interpreter's:
``python3 train.py --lr 0.1``.

A worker forked from the fork server would show the server's command line
(``python3 -m unirank.supervisor.fork.server ...``), one started as its own interpreter the
bootstrap's (``python3 -m unirank.supervisor.worker.bootstrap train.py ...``): ``ps``, ``top``,
``pgrep -f train.py``, ``pkill -f train.py`` and a cluster's process monitors would not find the
script. Before the worker's rendezvous, :func:`show_as_fresh` makes both read as ``torchrun``
would have started the worker, with the interpreter's path (``sys.executable``):

* ``sys.orig_argv`` becomes ``[sys.executable, SCRIPT, ARGS...]`` (or ``-m MODULE ARGS...``);
* what the kernel shows as the process's command line (``/proc/self/cmdline``, read by ``ps``
  and ``pgrep``) becomes the same arguments, NUL-separated, and its environment block
  (``/proc/self/environ``, which monitors read to map a process to its rank) the worker's
  environment, as the program finds it in ``os.environ``; a forked worker would show the
  server's, a bootstrap its private wiring variables.

The kernel reads both from memory ranges of the process (``arg_start..arg_end``,
``env_start..env_end``). First choice: new buffers holding exactly these bytes, made those
ranges with ``prctl(PR_SET_MM, PR_SET_MM_MAP)`` (no privilege needed since Linux 3.18 with
``CONFIG_CHECKPOINT_RESTORE``, which the common distributions' kernels have). Where the kernel
refuses it, the environment block stays as it was, and the arguments are written over the
process's own argument range, the rest filled with NULs (``/proc/self/cmdline`` then ends with
those NULs; ``ps`` and ``pgrep`` do not show them); a command line longer than that range is cut
to its length, its last byte a NUL: the interpreter, the script and the first arguments stay. A
bootstrap's range always holds a script's or module's command line (it is that line plus
``-m unirank.supervisor.worker.bootstrap``); a forked worker's is the server's.

``/proc/self/comm`` needs nothing: the server and the bootstrap are started as
``sys.executable``, as a fresh worker is. ``--exec`` (``--no-python``) replaces the process with
the program, which has its own. A ``Parallel`` worker (``--call FILE``) runs a function of the
program that started it: it shows that program's command line and ``sys.orig_argv`` (as a child
of ``multiprocessing``'s fork does), so that ``pgrep -f train.py`` finds it too. Linux only:
elsewhere only ``sys.orig_argv`` changes.

Reads: nothing from the environment (the worker's environment is passed in).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterable, Mapping, Sequence

__all__ = ["fresh_argv", "overwrite_in_place", "show_as_fresh"]

_PR_SET_MM = 35
_PR_SET_MM_MAP = 14
#: the field numbers (1-based) of ``/proc/self/stat`` that ``struct prctl_mm_map`` takes
_STAT_FIELDS = {"start_code": 26, "end_code": 27, "start_stack": 28, "start_data": 45,
                "end_data": 46, "start_brk": 47, "arg_start": 48, "arg_end": 49,
                "env_start": 50, "env_end": 51}
#: the buffers the kernel reads the command line and environment from, kept for the life of the
#: process
_shown: list[ctypes.Array[ctypes.c_char]] = []


class _MmMap(ctypes.Structure):
    """``struct prctl_mm_map`` (linux/prctl.h)."""

    _fields_ = (
        ("start_code", ctypes.c_uint64), ("end_code", ctypes.c_uint64),
        ("start_data", ctypes.c_uint64), ("end_data", ctypes.c_uint64),
        ("start_brk", ctypes.c_uint64), ("brk", ctypes.c_uint64),
        ("start_stack", ctypes.c_uint64), ("arg_start", ctypes.c_uint64),
        ("arg_end", ctypes.c_uint64), ("env_start", ctypes.c_uint64),
        ("env_end", ctypes.c_uint64), ("auxv", ctypes.c_void_p),
        ("auxv_size", ctypes.c_uint32), ("exe_fd", ctypes.c_uint32))


def fresh_argv(target: Sequence[str], python: str | None = None,
               parent: int | None = None) -> list[str] | None:
    """The command line a fresh interpreter running ``target`` (``SCRIPT ARGS`` or
    ``-m MODULE ARGS``) has; for ``--call``, that of the program ``parent`` (the pid of the
    ``Parallel`` that started the worker); None for ``--exec``, or when ``parent``'s cannot be
    read (see the module docstring)."""
    if not target or target[0] == "--exec":
        return None
    if target[0] != "--call":
        return [python or sys.executable, *target]
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as cmdline:
            found = cmdline.read()
    except OSError:
        return None
    return [os.fsdecode(arg) for arg in found.split(b"\0")[:-1]] or None


def _encoded(strings: Iterable[str]) -> bytes:
    return b"".join(os.fsencode(text) + b"\0" for text in strings)


def _stat_fields() -> dict[str, int]:
    with open("/proc/self/stat", encoding="ascii", errors="replace") as stat:
        values = stat.read().rsplit(")", 1)[1].split()
    return {name: int(values[number - 3]) for name, number in _STAT_FIELDS.items()}


def _remap(args: bytes, environ: bytes) -> bool:
    """Make new buffers holding ``args`` and ``environ`` the kernel's command-line and
    environment ranges; False if refused."""
    try:
        fields = _stat_fields()
        libc = ctypes.CDLL(None, use_errno=True)
    except (OSError, ValueError, IndexError):
        return False
    shown = [ctypes.create_string_buffer(data, len(data)) for data in (args, environ)]
    mm = _MmMap(**fields, auxv=None, auxv_size=0, exe_fd=0xFFFFFFFF)
    mm.arg_start = ctypes.addressof(shown[0])
    mm.arg_end = mm.arg_start + len(args)
    mm.env_start = ctypes.addressof(shown[1])
    mm.env_end = mm.env_start + len(environ)
    libc.sbrk.restype = ctypes.c_void_p
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                           ctypes.c_ulong]
    prctl = libc.prctl
    mm.brk = libc.sbrk(0) or 0  # read last: the kernel takes it as the heap's end
    if prctl(_PR_SET_MM, _PR_SET_MM_MAP, ctypes.byref(mm), ctypes.sizeof(mm), 0) != 0:
        return False
    _shown.extend(shown)
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


def _current_args() -> bytes:
    with open("/proc/self/cmdline", "rb") as cmdline:
        return cmdline.read()


def show_as_fresh(target: Sequence[str], environ: Mapping[str, str],
                  parent: int | None = None) -> None:
    """Make ``sys.orig_argv``, the process's command line and its environment block a fresh
    interpreter's running ``target`` with ``environ`` (``parent``: the pid of the program that
    started the worker; see the module docstring)."""
    if target and target[0] == "--exec":
        return
    argv = fresh_argv(target, parent=parent)
    if argv is not None:
        sys.orig_argv = argv
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError):
        args = _current_args() if argv is None else _encoded(argv)
        block = _encoded(f"{name}={value}" for name, value in environ.items())
        if not _remap(args, block) and argv is not None:
            overwrite_in_place(args)
