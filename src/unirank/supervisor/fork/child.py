"""A child of the fork server (:mod:`.server`) turning into its worker.

Before any of the program's code runs, the child

1. puts the passed descriptors (the server's own were closed at the fork) where the worker's
   environment says they are (stdout and stderr at 1 and 2, the store socket and pipes at the
   numbers the supervisor gave; ``worker_environ`` is the same as for a worker started as its
   own interpreter);
2. applies its own environment (the whole contract: RANK, LOCAL_RANK, CUDA_VISIBLE_DEVICES,
   ...), as differences from the server's, through ``os.environ`` (so C code's ``getenv`` sees
   it too), and makes stdout and stderr unbuffered when PYTHONUNBUFFERED says so;
3. sets the values its libraries fixed when the server imported them to the worker's own, and
   seeds its random streams again (:mod:`.importtime`);
4. runs :func:`unirank.supervisor.worker.main.run_worker`, as the bootstrap does;
5. ends as the interpreter does (:func:`leave`): the exit status of ``SystemExit``
   (:func:`unirank.errorfile.exit_status`), or the traceback through ``sys.excepthook`` and
   exit code 1; non-daemon threads joined, atexit handlers run, Python's and C's buffered
   streams flushed (open files too), and an uncaught KeyboardInterrupt ends the process by
   SIGINT. It skips the interpreter's module teardown:
   in a forked process that step writes to, and so copies, every page shared with the server
   (0.2 s per worker with torch). Objects still alive at exit are therefore not finalised,
   which Python does not promise either (``__del__``'s documentation).

The parent-death signal (the child dies with the server, which dies with the supervisor) and
the new session were set in :mod:`.server` before the server gave the child's pid on.

Runs in a child the fork server forked, from the server's own loop; it gets the server's message
as a :class:`~.protocol.Request`, and imports no other side of the fork server.

Reads: PYTHONUNBUFFERED (the worker's, once applied).
"""

from __future__ import annotations

import atexit
import fcntl
import io
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from unirank.errorfile import exit_status
from unirank.supervisor.fork.importtime import apply_worker_values
from unirank.supervisor.fork.protocol import Request
from unirank.supervisor.worker.main import run_worker
from unirank.supervisor.worker.target import flush_open_streams

__all__ = ["become_worker", "leave", "place_fds"]


def place_fds(received: Sequence[int], targets: Sequence[int]) -> None:
    """Move each ``received[i]`` to descriptor ``targets[i]`` (inheritable, like ``pass_fds``
    and stdio), whatever the two lists' numbers have in common."""
    floor = max([*received, *targets, 2]) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in received]
    for fd in received:
        os.close(fd)
    for fd, target in zip(moved, targets):
        os.dup2(fd, target, inheritable=True)
        os.close(fd)


def _apply_environment(request: Request) -> None:
    for name in request.unset_env:
        os.environ.pop(name, None)
    os.environ.update(request.set_env)


def _match_stdio_buffering() -> None:
    """Make stdout and stderr unbuffered, or buffered, as PYTHONUNBUFFERED now says (the server's
    interpreter chose when it started, from its own environment).

    Reads: PYTHONUNBUFFERED.
    """
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        if stream is None or bool(getattr(stream, "write_through", False)) == unbuffered:
            continue
        stream.flush()
        binary: Any = (io.FileIO(fd, "w", closefd=False) if unbuffered
                       else io.BufferedWriter(io.FileIO(fd, "w", closefd=False)))
        replacement = io.TextIOWrapper(
            binary, encoding=stream.encoding, errors=stream.errors,
            line_buffering=fd == 2 and not unbuffered, write_through=unbuffered)
        setattr(sys, name, replacement)
        setattr(sys, f"__{name}__", replacement)


def _system_exit(code: object) -> int:
    """The exit status ``SystemExit(code)`` gives, printing a code that is no number to
    stderr, as the interpreter does."""
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
    return exit_status(code)


def _run(request: Request) -> tuple[int, bool]:
    """Run the worker; its exit status, and whether a KeyboardInterrupt ended it."""
    try:
        run_worker(request.target, entered_at=request.forked_at, environ=os.environ,
                   preloaded=request.preloaded)
    except SystemExit as exc:
        return _system_exit(exc.code), False
    except BaseException as exc:  # the interpreter's uncaught-exception path
        sys.excepthook(type(exc), exc, exc.__traceback__)
        return 1, isinstance(exc, KeyboardInterrupt)
    return 0, False


def leave(code: int, interrupted: bool = False) -> NoReturn:
    """End the worker as the interpreter would, without its module teardown (see the module
    docstring)."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    flush_open_streams()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def become_worker(request: Request) -> NoReturn:
    """Turn this forked child into its worker, run it and end (see the module docstring)."""
    place_fds(request.fds, request.targets)
    _apply_environment(request)
    _match_stdio_buffering()
    apply_worker_values(os.environ)
    leave(*_run(request))
