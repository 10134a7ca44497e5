"""Running a worker's target, as ``python`` would: ``SCRIPT ARGS...`` (``__main__``,
``sys.argv``, ``__file__``, ``sys.path[0]``), ``-m MODULE ARGS...``, ``--exec PROGRAM ARGS...``
(``unirank run --no-python``: the program replaces this process) or ``--call FILE`` (a function
that :class:`~unirank.runtime.parallel.Parallel` pickled: run by
:func:`unirank.runtime.worker.run_call_file`, the one seam from ``supervisor/`` into
``runtime/``).

Tracebacks leave out the bootstrap's and runpy's frames, which ``python script.py`` lacks, and
an exception that leaves the target (a ``SystemExit`` with a failing code included) is recorded
in the worker's error file (:mod:`unirank.errorfile`) at once, before the worker's own ending
(exit barrier, interpreter teardown) closes its connections to the other ranks: so its time
comes before the failures it causes in them. A failure inside a collective (torch's
collective timeout) first gets the hang watcher's report and the hang as a note
(:mod:`unirank.hang.onstop`).
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import gc
import importlib.machinery
import io
import os
import runpy
import sys
import types
import zipfile
from collections.abc import Callable, Sequence
from typing import Any

from unirank.errorfile import record_exception

__all__ = ["USAGE", "flush_open_streams", "run_target"]

USAGE = ("usage: python -m unirank.supervisor.worker.bootstrap "
         "(SCRIPT | -m MODULE | --exec PROGRAM | --call FILE) [ARGS...]")
_WORKER = os.path.dirname(os.path.abspath(__file__))
_SUPERVISOR = os.path.dirname(_WORKER)
#: the files whose frames a traceback leaves out: the bootstrap's (and the payload runner's)
_HIDDEN = frozenset(
    [os.path.join(_WORKER, name) for name in ("bootstrap.py", "main.py", "target.py")]
    + [os.path.join(_SUPERVISOR, "fork", name) for name in ("child.py", "server.py")]
    + [os.path.join(os.path.dirname(_SUPERVISOR), "runtime", "worker.py")])


def _hidden(filename: str) -> bool:
    """True for the frames of the bootstrap and of runpy, which ``python script.py`` lacks."""
    if filename.startswith("<frozen runpy"):
        return True
    path = os.path.abspath(filename)
    return path in _HIDDEN or os.path.basename(path) == "runpy.py"


def _trim(exc: BaseException) -> BaseException:
    """``exc`` with the bootstrap's and runpy's leading frames left out of its traceback."""
    tb = exc.__traceback__
    while tb is not None and _hidden(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return exc.with_traceback(tb)


def _trimmed_excepthook(
    hook: Callable[[type[BaseException], BaseException, types.TracebackType | None], Any],
) -> Callable[[type[BaseException], BaseException, types.TracebackType | None], Any]:
    """An excepthook that drops the bootstrap's and runpy's frames, as ``python script.py``."""

    def excepthook(
        kind: type[BaseException], value: BaseException, tb: types.TracebackType | None
    ) -> Any:
        if isinstance(value, BaseException):
            value = _trim(value.with_traceback(tb))  # the default hook prints __traceback__
            record_exception(value)
            tb = value.__traceback__
        return hook(kind, value, tb)

    return excepthook


def flush_open_streams() -> None:
    """Flush every open Python stream (files a program left open included), then C's stdio
    buffers: what the exit of ``python script.py`` does when it clears its ``__main__``. A script
    run through runpy leaves its globals as cyclic garbage, which the interpreter's exit does not
    finalise, so the worker's exit calls this."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    for obj in gc.get_objects():
        # type(), not isinstance(): the latter reads __class__, which some objects compute
        if issubclass(type(obj), io.IOBase):
            with contextlib.suppress(OSError, ValueError):
                if not obj.closed:
                    obj.flush()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)


def _exec(argv: Sequence[str]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(argv[0], list(argv))
    except OSError as exc:
        raise SystemExit(f"unirank: cannot run {argv[0]!r} (--no-python): "
                         f"{exc.strerror or exc}") from None


def _run_script(script: str) -> None:
    """Run ``script`` as ``python script`` does: as ``__main__`` (which stays in
    ``sys.modules``), with an absolute ``__file__`` and ``sys.argv[0]`` as given; a folder or a
    zip archive with a ``__main__.py`` through runpy."""
    path = os.path.abspath(script)
    if not os.path.isfile(path) or zipfile.is_zipfile(path):
        runpy.run_path(script, run_name="__main__")
        return
    loader = importlib.machinery.SourceFileLoader("__main__", path)
    code = compile(loader.get_data(path), path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __loader__=loader, __spec__=None,
                         __package__=None, __builtins__=builtins)
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def run_target(argv: Sequence[str]) -> None:
    """Run ``SCRIPT ARGS...``, ``-m MODULE ARGS...``, ``--exec PROGRAM ARGS...`` or
    ``--call FILE`` (see the module docstring); what it raises is recorded, then raised on.

    Reads: TORCHELASTIC_ERROR_FILE (through :func:`~unirank.errorfile.record_exception`).
    """
    if not argv or (argv[0] in ("-m", "--exec", "--call") and len(argv) < 2):
        raise SystemExit(USAGE)
    sys.excepthook = _trimmed_excepthook(sys.excepthook)
    try:
        _dispatch(argv)
    except BaseException as exc:
        _note_hang(exc)
        record_exception(_trim(exc))
        raise


def _note_hang(exc: BaseException) -> None:
    """A failure inside a collective (torch's collective timeout): the hang watcher's report,
    and its wavefront as ``exc``'s note (:meth:`unirank.hang.watcher.Watcher.failure_report`)."""
    from unirank.hang.failure import add_hang_note
    from unirank.hang.watcher import running

    watcher = running()
    if watcher is not None:
        add_hang_note(exc, watcher.failure_report(exc))


def _dispatch(argv: Sequence[str]) -> None:
    """Run the target ``argv`` names."""
    if argv[0] == "--exec":
        _exec(argv[1:])
    elif argv[0] == "--call":
        from unirank.runtime.worker import run_call_file

        run_call_file(argv[1])
    elif argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # runpy replaces argv[0] with the module's file
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        script = argv[0]
        sys.argv = [script, *argv[1:]]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        _run_script(script)
