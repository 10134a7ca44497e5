"""The workers' output on its way out: pipes to the console, log files and the failure summary.

Runs in the ``unirank run`` parent (never imports torch), inside the engine's loop
(:mod:`.engine`): the engine owns the selector, and hands each pipe that has data to
:meth:`WorkerStreams.pump`.

Each worker's stdout and stderr go through the supervisor, which passes them on in whole lines
(:class:`~unirank.supervisor.output.LineBuffer`, :class:`~unirank.supervisor.rows.RankRows`),
draws progress bars in place on a terminal and as a few lines elsewhere
(:mod:`~unirank.supervisor.console`), tags them, filters them (``--local-ranks-filter``), writes
them to log files (``--redirects``, ``--tee``, torchrun's
``<log_dir>/<run_id>/attempt_<n>/<local_rank>/``), copies the lines that hold one of
``--duplicate-std*-filters``' strings into the attempt's ``filtered_std*.log``
(:class:`~unirank.supervisor.output.LineCopy`) and keeps stderr's tail for the failure
summary. Lines that are no news on a console go to one file of the attempt instead (the
``fold_file``), and :meth:`WorkerStreams.folded` gives the one line that says where: torch's
C++ stack dumps (:class:`~unirank.supervisor.output.StackLines`), and, once the supervisor
stopped the workers itself because the world changed (:meth:`WorkerStreams.fold`: a node lost,
the rendezvous moved, a node evicted), every line they print while they end (gloo's
tracebacks of their lost peers). Descriptors that write to one sink (stdout and stderr are
often one terminal) share one view of it, so that the live rows are drawn once. The engine's
own lines go through the same view (:meth:`WorkerStreams.say`). A sink whose reader went away
gets nothing more; the run goes on.

Reads: no environment variable.
"""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import time

from unirank.supervisor.console import LogView, TerminalView, tagged, terminal_width
from unirank.supervisor.output import LineBuffer, LineCopy, StackLines
from unirank.supervisor.rows import RankRows
from unirank.supervisor.summary import OutputTail
from unirank.words import counted

__all__ = ["WorkerStreams"]

#: how much one read takes from a pipe
_CHUNK = 65536


class _Stream:
    """One worker output pipe: where its lines go, how they are tagged, what is kept."""

    def __init__(self, fd: int, key: int, targets: list[int], prefix: bytes | None,
                 tail: OutputTail | None, copy: tuple[int, LineCopy] | None = None,
                 console: tuple[int, bytes | None] | None = None) -> None:
        self.fd = fd
        #: the console's fd and the prefix of the lines shown there (a teed stream's)
        self.console = (console[0], console[1].decode("utf-8", "surrogateescape")) \
            if console is not None and console[1] is not None else None
        #: its place among the node's streams (a terminal shows live rows in this order)
        self.key = key
        self.targets = targets
        self.prefix = (prefix or b"").decode("utf-8", "surrogateescape")
        self.lines = LineBuffer()
        self.stack = StackLines()
        self.rows = RankRows()
        self.tail = tail
        #: the file its filtered lines are copied to, and the filter
        self.copy = copy


class WorkerStreams:
    """Every output pipe of one node's workers, and the sinks they are shown on."""

    def __init__(self, selector: selectors.BaseSelector, *, err_fd: int, prog: str,
                 fold_file: str | None = None) -> None:
        #: the engine's selector, where each pipe is registered with its stream as data
        self._selector = selector
        self._err_fd = err_fd
        self._prog = prog
        self._streams: dict[int, _Stream] = {}
        #: what each output fd writes to (fds 1 and 2 are often one terminal), and how the
        #: streams that share it are shown there
        self._sinks: dict[int, tuple[int, int]] = {}
        self._views: dict[tuple[int, int], TerminalView | LogView] = {}
        self._files: list[int] = []
        #: the files of filtered lines, by path (one file for all local ranks)
        self._copies: dict[str, int] = {}
        self._broken: set[int] = set()
        #: the console's fds (a worker stream's that is shown there)
        self._consoles: set[int] = set()
        #: where the console's folded lines go: path (None: nowhere), fd (once made), count
        self._fold: tuple[str | None, int | None, int] = (fold_file, None, 0)
        #: the workers were stopped: all their console lines are folded (:meth:`fold`)
        self._stopped = False

    # -- opening ------------------------------------------------------------------------------

    def targets(self, console_fd: int | None, log_file: str | None) -> list[int]:
        """Where one worker stream goes: ``console_fd`` (None: not shown) and ``log_file``
        (None: none; else created now, its folder too)."""
        targets = [] if console_fd is None else [console_fd]
        if console_fd is not None:
            self._consoles.add(console_fd)
        if log_file is not None:
            os.makedirs(os.path.dirname(log_file), exist_ok=True)
            fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            self._files.append(fd)
            targets.append(fd)
        return targets

    def add(self, fd: int, key: int, targets: list[int], prefix: bytes | None,
            tail: OutputTail | None, copy: LineCopy | None = None,
            console: tuple[int, bytes | None] | None = None) -> None:
        """Read the pipe ``fd`` from now on: its lines go to ``targets`` with ``prefix``, its
        bytes to ``tail`` too (stderr), the lines ``copy`` picks to its file; ``key`` orders
        its live rows on a terminal; ``console``: the console's fd and the prefix of its lines
        there, when other than ``prefix`` (a teed stream's)."""
        os.set_blocking(fd, False)
        for target in targets:
            self._view(target)
        copy_to = None
        if copy is not None:
            if copy.path not in self._copies:
                self._copies[copy.path] = self.targets(None, copy.path)[0]
            copy_to = (self._copies[copy.path], copy)
        stream = _Stream(fd, key, targets, prefix, tail, copy_to, console)
        self._streams[fd] = stream
        self._selector.register(fd, selectors.EVENT_READ, stream)

    # -- reading ------------------------------------------------------------------------------

    def pump(self, stream: _Stream) -> None:
        """Pass on what ``stream``'s pipe holds (the selector found it readable)."""
        try:
            data = os.read(stream.fd, _CHUNK)
        except BlockingIOError:
            return
        if not data:
            self._close_stream(stream)
            return
        self._feed(stream, data)

    def next_due(self) -> float | None:
        """When (``time.monotonic()``) the oldest held partial line is due, or None."""
        due = [d for d in (s.lines.deadline for s in self._streams.values()) if d is not None]
        return min(due) if due else None

    def flush_partial_lines(self, now: float) -> None:
        """Pass on the partial lines held for ``PARTIAL_LINE_DELAY`` (see :mod:`.output`)."""
        for stream in list(self._streams.values()):
            deadline = stream.lines.deadline
            if deadline is not None and deadline <= now:
                self._show(stream, stream.lines.flush_partial())

    def drain(self) -> None:
        """After the last worker ended: pass on what is left in the pipes, without waiting for
        children that may still hold them open."""
        for stream in list(self._streams.values()):
            while True:
                try:
                    data = os.read(stream.fd, _CHUNK)
                except BlockingIOError:
                    break
                if not data:
                    break
                self._feed(stream, data)
            self._close_stream(stream)

    def close(self) -> None:
        """Close every pipe still open and every log file."""
        for stream in list(self._streams.values()):
            self._selector.unregister(stream.fd)
            os.close(stream.fd)
        self._streams.clear()
        for fd in self._files:
            os.close(fd)
        self._files.clear()
        self._copies.clear()

    # -- folding ------------------------------------------------------------------------------

    def fold(self) -> None:
        """From now on, every worker line meant for the console goes to the fold file (the
        supervisor stopped them: see the module docstring); their live rows leave the console
        now. Nothing changes without a fold file."""
        if self._stopped or self._fold[0] is None:
            return
        self._stopped = True
        now = time.monotonic()
        for stream in self._streams.values():
            for target in stream.targets:
                if target in self._consoles:
                    self._write(target, self._view(target).update(
                        stream.key, self._prefix(stream, target), [], [], now))

    def folded(self) -> str | None:
        """The line that says where the folded lines are (None: none was folded)."""
        path, _fd, count = self._fold
        if path is None or not count:
            return None
        return (f"{counted(count, 'line')} of the workers' output (torch's C++ stack dumps"
                f"{', what they printed once stopped' if self._stopped else ''}) are in {path}")

    def _to_console(self, stream: _Stream, lines: list[str]) -> list[str]:
        """The lines of ``stream`` that stay on the console; the others go to the fold file."""
        if self._fold[0] is None:
            return lines
        picked = [self._stopped or stream.stack.picks(line) for line in lines]
        if any(picked):
            self._fold_lines(stream.prefix, [line for line, p in zip(lines, picked) if p])
        return [line for line, p in zip(lines, picked) if not p]

    def _fold_lines(self, prefix: str, lines: list[str]) -> None:
        """Write ``lines`` (with the stream's ``prefix``) to the fold file."""
        path, fd, count = self._fold
        assert path is not None
        if fd is None:
            fd = self.targets(None, path)[0]
        text = "".join(f"{tagged(prefix, line)}\n" for line in lines)
        self._write(fd, text.encode("utf-8", "surrogateescape"))
        self._fold = (path, fd, count + len(lines))

    # -- writing ------------------------------------------------------------------------------

    def say(self, message: str) -> None:
        """One line of the engine's own (``prog: message``) on stderr."""
        self._write(self._err_fd, self._view(self._err_fd).update(
            -1, "", [f"{self._prog}: {message}"], [], time.monotonic()))

    def show(self, text: str) -> None:
        """Lines of the engine's own, as they are (a hang report), on stderr."""
        self._write(self._err_fd, self._view(self._err_fd).update(
            -1, "", text.rstrip("\n").split("\n"), [], time.monotonic()))

    def _feed(self, stream: _Stream, data: bytes) -> None:
        if stream.tail is not None:
            stream.tail.feed(data)
        self._show(stream, stream.lines.feed(data, time.monotonic()))

    def _show(self, stream: _Stream, chunk: bytes, *, end: bool = False) -> None:
        """Apply ``chunk`` to the stream's rows and show what changed on each of its targets
        (see :mod:`.console`); ``end``: the stream ended."""
        if not chunk and not end:
            return
        lines = stream.rows.feed(chunk)
        if end:
            lines += stream.rows.close()
        live = [] if end else stream.rows.live()
        if stream.copy is not None:
            fd, copy = stream.copy
            picked = "".join(f"{copy.tag}{line}\n" for line in lines if copy.picks(line))
            if picked:
                self._write(fd, picked.encode("utf-8", "surrogateescape"))
        now = time.monotonic()
        shown = self._to_console(stream, lines) if any(
            t in self._consoles for t in stream.targets) else lines
        for target in stream.targets:
            prefix = self._prefix(stream, target)
            on_console = target in self._consoles
            self._write(target, self._view(target).update(
                stream.key, prefix, shown if on_console else lines,
                [] if on_console and self._stopped else live, now))

    @staticmethod
    def _prefix(stream: _Stream, target: int) -> str:
        """The prefix of ``stream``'s lines on ``target`` (a teed stream's on the console)."""
        return stream.console[1] if stream.console is not None and \
            target == stream.console[0] else stream.prefix

    def _close_stream(self, stream: _Stream) -> None:
        self._show(stream, stream.lines.flush_partial(), end=True)
        self._selector.unregister(stream.fd)
        del self._streams[stream.fd]
        os.close(stream.fd)

    def _view(self, fd: int) -> TerminalView | LogView:
        """How ``fd``'s sink shows the streams, its terminal's width brought up to date."""
        sink = self._sinks.get(fd)
        if sink is None:
            sink = self._sinks[fd] = _sink_of(fd)
        view = self._views.get(sink)
        if view is None:
            view = self._views[sink] = TerminalView() if os.isatty(fd) else LogView()
        if isinstance(view, TerminalView):
            columns = None
            with contextlib.suppress(OSError):
                columns = os.get_terminal_size(fd).columns
            view.width = terminal_width(columns)
        return view

    def _write(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view and fd not in self._broken:
            try:
                written = os.write(fd, view)
            except BlockingIOError:
                select.select([], [fd], [])
                continue
            except (BrokenPipeError, OSError):
                self._broken.add(fd)  # the reader went away: drop this stream's output
                return
            view = view[written:]


def _sink_of(fd: int) -> tuple[int, int]:
    """What ``fd`` writes to (device and inode), so that two fds on one terminal are one sink."""
    try:
        info = os.fstat(fd)
    except OSError:
        return (-1, fd)
    return (info.st_dev, info.st_ino)
