"""Variables that the program sets before it imports torch, which the worker had loaded already.

A worker imports torch before the program runs (a forked worker: the fork server imported it;
otherwise the rendezvous does), and torch and the libraries it loads read some variables once,
when they are loaded. Under ``python script.py`` or torchrun a script that sets one of them at its
top (``os.environ["OMP_NUM_THREADS"] = "2"`` before ``import torch``) gets it; here the worker
gives it the same effect, or one line on stderr that says it was ignored and what to do.

When: :func:`watch` notes the variables' values just before the program runs and wraps
``builtins.__import__`` until the first import of ``torch`` or one of its modules, by anyone (the
program, a library, :func:`unirank.init`). At that import, before it returns, every variable that
now differs is applied or reported, and the wrapper removes itself: a script's later changes are
ignored as under torchrun, and nothing is paid after that import (an audit hook on ``os.putenv``
could not be removed and would see every event of the program's life; applying when a group
starts would be too late for the computations before it). The wrapper costs one Python call per
``import`` statement until then.

Applied (with torch 2.13; plain ``python`` reads each at ``import torch``):

* MKL_NUM_THREADS, else OMP_NUM_THREADS: torch's intra-op thread count
  (``torch.set_num_threads``), at most the machine's physical cores, as MKL caps it (a count
  above the cores gives the cores here, as under ``python``; a machine with hyper-threads was
  not at hand to check that MKL leaves them out);
* OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS, OMP_NUM_THREADS: each loaded OpenBLAS's count
  (:func:`unirank.supervisor.fork.importtime.set_openblas_threads`);
* TORCH_DISTRIBUTED_DEBUG: ``torch.distributed.set_debug_level_from_env`` (DETAIL then wraps the
  groups started afterwards in their checking wrapper, as at import);
* TORCH_LOGS, TORCH_LOGS_OUT, TORCH_LOGS_FORMAT, TORCH_LOGS_TRACE_ID_FILTER, TORCH_TRACE,
  TORCH_DTRACE: ``torch._logging._init_logs``;
* TORCH_CPP_LOG_LEVEL (set, not unset): c10's ``c10::initLogging()``, which reads it again,
  called through ctypes by its exported C++ name (reported instead where a torch lacks it).

Reported (no call changes them once loaded): TORCH_SHOW_CPP_STACKTRACES, libgomp's
OMP_PROC_BIND, OMP_PLACES, OMP_WAIT_POLICY and GOMP_SPINCOUNT, the thread counts and
TORCH_CPP_LOG_LEVEL when the program unsets them, and any of the above whose call failed.
The line is printed once per variable, by rank 0 only.

Read when used, so nothing to do: NCCL_*, TORCH_NCCL_*, GLOO_SOCKET_IFNAME and the group's other
settings (read when a group starts).
"""

from __future__ import annotations

import builtins
import contextlib
import os
import shlex
import sys
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

__all__ = ["WATCHED", "apply_changes", "changed", "ignored_line", "intra_op_threads", "watch"]

_Applier = Callable[[Mapping[str, str]], bool]


def _positive(text: str | None) -> int | None:
    """The count a thread-count variable gives (its first comma-separated item), if any."""
    head = (text or "").split(",")[0].strip()
    return int(head) if head.isdigit() and int(head) > 0 else None


def _physical_cores() -> int:
    """The machine's physical cores (sibling hyper-threads counted once)."""
    root = "/sys/devices/system/cpu"
    cores: set[str] = set()
    with contextlib.suppress(OSError):
        for entry in os.listdir(root):
            if entry.startswith("cpu") and entry[3:].isdigit():
                with contextlib.suppress(OSError), \
                        open(f"{root}/{entry}/topology/thread_siblings_list",
                             encoding="ascii") as siblings:
                    cores.add(siblings.read().strip())
    return len(cores) or os.cpu_count() or 1


def intra_op_threads(environ: Mapping[str, str], cores: int) -> int | None:
    """torch's intra-op thread count at import from ``environ`` (None: neither is set).

    Reads: MKL_NUM_THREADS, OMP_NUM_THREADS (from ``environ``).
    """
    count = _positive(environ.get("MKL_NUM_THREADS"))
    if count is None:
        count = _positive(environ.get("OMP_NUM_THREADS"))
    return None if count is None else min(count, cores)


def _torch_threads(environ: Mapping[str, str]) -> bool:
    count = intra_op_threads(environ, _physical_cores())
    if count is None:
        return False
    import torch

    torch.set_num_threads(count)
    return True


def _openblas_threads(environ: Mapping[str, str]) -> bool:
    from unirank.supervisor.fork.importtime import set_openblas_threads

    set_openblas_threads(environ)
    return True


def _distributed_debug(environ: Mapping[str, str]) -> bool:
    import torch.distributed as dist

    dist.set_debug_level_from_env()  # type: ignore[attr-defined]  # reads os.environ
    return True


def _torch_logs(environ: Mapping[str, str]) -> bool:
    import torch._logging

    torch._logging._init_logs()  # type: ignore[attr-defined]  # reads os.environ
    return True


def _cpp_log_level(environ: Mapping[str, str]) -> bool:
    if "TORCH_CPP_LOG_LEVEL" not in environ:
        return False  # c10 keeps the level it has: nothing reads the default again
    import ctypes

    import torch

    library = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
    library._ZN3c1011initLoggingEv()  # c10::initLogging(): reads os.environ
    return True


def _call(applier: _Applier, environ: Mapping[str, str]) -> bool:
    """``applier(environ)``: False when it could not apply, or failed (never raised)."""
    try:
        return applier(environ)
    except Exception:
        return False


#: the variables applied when the program changed them, each group with the call that applies it
_APPLIED: tuple[tuple[tuple[str, ...], _Applier], ...] = (
    (("MKL_NUM_THREADS", "OMP_NUM_THREADS"), _torch_threads),
    (("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"), _openblas_threads),
    (("TORCH_DISTRIBUTED_DEBUG",), _distributed_debug),
    (("TORCH_LOGS", "TORCH_LOGS_OUT", "TORCH_LOGS_FORMAT", "TORCH_LOGS_TRACE_ID_FILTER",
      "TORCH_TRACE", "TORCH_DTRACE"), _torch_logs),
    (("TORCH_CPP_LOG_LEVEL",), _cpp_log_level),
)
#: read once when torch or libgomp is loaded, and changed by no call afterwards
_REPORTED = ("TORCH_SHOW_CPP_STACKTRACES", "OMP_PROC_BIND", "OMP_PLACES", "OMP_WAIT_POLICY",
             "GOMP_SPINCOUNT")
#: every variable :func:`watch` looks at
WATCHED = tuple(dict.fromkeys([*(n for names, _ in _APPLIED for n in names), *_REPORTED]))


def changed(before: Mapping[str, str | None], environ: Mapping[str, str]) -> list[str]:
    """The watched variables whose value in ``environ`` differs from ``before`` (None: unset).

    Reads: :data:`WATCHED` (from ``environ``).
    """
    return [name for name in WATCHED if environ.get(name) != before.get(name)]


def apply_changes(names: list[str], environ: Mapping[str, str]) -> list[str]:
    """Apply the changed variables ``names`` that can be applied now; those that could not.

    Reads: the variables in ``names`` and those read with them (from ``environ``; torch's own
    calls read ``os.environ``).
    """
    failed = set(_REPORTED)
    for group, applier in _APPLIED:
        if any(name in names for name in group) and not _call(applier, environ):
            failed.update(group)
    return [name for name in names if name in failed]


def ignored_line(name: str, environ: Mapping[str, str]) -> str:
    """The line that says the program's change of ``name`` was ignored, and what to do.

    Reads: ``name`` (from ``environ``).
    """
    value = environ.get(name)
    if value is None:
        return (f"unirank: {name}, unset by the script, stays as it was: torch was loaded before "
                f"the script ran; unset it where unirank starts (env -u {name} unirank run ...)")
    return (f"unirank: {name}={value}, set by the script, has no effect: torch was loaded before "
            f"the script ran; set it where unirank starts "
            f"({name}={shlex.quote(value)} unirank run ...)")


def watch(environ: MutableMapping[str, str], *, report: bool) -> None:
    """Note the watched variables now, and apply or report (``report``: print to stderr) those
    that differ at the first import of torch (see the module docstring).

    Reads: :data:`WATCHED` (from ``environ``).
    """
    before = {name: environ.get(name) for name in WATCHED}
    original = builtins.__import__
    done = False

    def importing(name: str, globals: Any = None, locals: Any = None,
                  fromlist: Any = (), level: int = 0) -> Any:
        nonlocal done
        if not done and level == 0 and (name == "torch" or name.startswith("torch.")):
            done = True
            if builtins.__import__ is importing:
                builtins.__import__ = original
            ignored = apply_changes(changed(before, environ), environ)
            for variable in ignored if report else ():
                print(ignored_line(variable, environ), file=sys.stderr, flush=True)
        return original(name, globals, locals, fromlist, level)

    builtins.__import__ = importing
