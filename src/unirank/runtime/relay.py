"""The spawned workers' console when the caller's ``sys.stdout`` / ``sys.stderr`` are not files:
a Jupyter kernel's streams (which send what is written to them to the cell), a test's
captured output, ``contextlib.redirect_stdout``.

The engine (:mod:`unirank.supervisor.engine`) writes the workers' output to descriptors, in
whole lines. :class:`ConsoleRelay` hands it the stream's own descriptor where the stream is a
file (``io.TextIOWrapper`` with a ``fileno()``; flushed first, so that what the caller printed
comes before), and otherwise a pipe whose bytes a thread of the caller's writes to the stream
as text, line by line, until the engine is done with it. The thread runs in a copy of the
caller's context (``contextvars``): a Jupyter kernel keeps there which cell is running, so the
lines go to the cell that called, not to whichever message the kernel handled last.

Runs in the caller's process (which may have threads anyway: a kernel has several); never in
the fork server. Reads: no environment variable.
"""

from __future__ import annotations

import codecs
import contextlib
import contextvars
import io
import os
import threading
from types import TracebackType
from typing import IO, Any

from unirank.signals import start_shielded

__all__ = ["JOIN_TIMEOUT", "ConsoleRelay", "own_fd"]

#: how long the relay waits for its thread to pass on the last bytes once the engine is done
JOIN_TIMEOUT = 10.0
_CHUNK = 65536


def own_fd(stream: IO[str] | Any) -> int | None:
    """The descriptor that writes where ``stream`` writes, or None when it has none (a kernel's
    stream: its ``fileno()`` is the kernel's terminal, not the cell)."""
    if not isinstance(stream, io.TextIOWrapper):
        return None
    try:
        return stream.fileno()
    except (OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return None


def _pump(read_fd: int, stream: IO[str] | Any) -> None:
    """Write what arrives on ``read_fd`` to ``stream`` until its end, in whole lines (the rest
    at the end)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    while True:
        try:
            data = os.read(read_fd, _CHUNK)
        except InterruptedError:  # pragma: no cover - retried by Python itself
            continue
        text = pending + decoder.decode(data, final=not data)
        cut = max(text.rfind("\n"), text.rfind("\r")) + 1 if data else len(text)
        pending = text[cut:]
        if cut and stream is not None:
            with contextlib.suppress(OSError, ValueError):  # a closed stream gets nothing
                stream.write(text[:cut])
                stream.flush()
        if not data:
            return


class ConsoleRelay:
    """``with ConsoleRelay(sys.stdout, sys.stderr) as (out_fd, err_fd):`` the descriptors to
    give the engine for each stream (see the module docstring)."""

    def __init__(self, *streams: IO[str] | Any) -> None:
        self._streams = streams
        self._threads: list[tuple[threading.Thread, int, int]] = []

    def __enter__(self) -> tuple[int, ...]:
        fds = []
        for stream in self._streams:
            fd = own_fd(stream)
            if fd is not None:
                stream.flush()
                fds.append(fd)
                continue
            if stream is not None:
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
            read_fd, write_fd = os.pipe()
            context = contextvars.copy_context()  # the kernel's cell, for its stream
            thread = threading.Thread(target=context.run, args=(_pump, read_fd, stream),
                                      name="unirank-console-relay", daemon=True)
            start_shielded(thread)  # the caller's Ctrl-C goes to its main thread
            self._threads.append((thread, read_fd, write_fd))
            fds.append(write_fd)
        return tuple(fds)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for _thread, _read_fd, write_fd in self._threads:
            os.close(write_fd)  # the end of the relay's input
        for thread, read_fd, _write_fd in self._threads:
            thread.join(JOIN_TIMEOUT)
            if not thread.is_alive():
                os.close(read_fd)  # else the stream blocks: the thread keeps it, a daemon
        self._threads.clear()
