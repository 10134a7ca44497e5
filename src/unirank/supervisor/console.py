"""Many worker streams shown on one console or log file: what is written there, as bytes (pure;
no I/O).

Each stream (a worker's stdout or stderr) is read by its own
:class:`~unirank.supervisor.rows.RankRows` into finished lines and live rows (progress bars);
a view turns them into what one sink (a terminal, a pipe, a log file) receives:

* :class:`TerminalView` -- a terminal, as docker compose, cargo or pip draw their bars: finished
  lines from any stream scroll up above a block of live rows at the bottom, one per bar, in
  stream order, which is redrawn in place (``\\r``, ``\\x1b[nA``, ``\\x1b[J``) and never
  repeated. A live row is cut to the terminal's width so that it never wraps; a bar's final
  state (tqdm ends it with ``\\n``) is a finished line and stays on screen.
* :class:`LogView` -- a pipe or a file: no escape sequence at all; finished lines as they are; a
  live row as a line of its own when it first shows, then at most every
  :data:`PROGRESS_EVERY` seconds, and its final state once.

Both put the stream's ``--tag-output`` prefix before every line and row, but before one that
already starts with it (:func:`tagged`: torch's ``[rank1]: `` before each line of a traceback
once a group started, under the tag ``[rank1]:``).

Runs in the ``unirank run`` parent, for :mod:`.streams`. Reads: no environment variable.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

__all__ = ["DEFAULT_WIDTH", "PROGRESS_EVERY", "LogView", "TerminalView", "fit", "tagged",
           "terminal_width"]

#: seconds between two lines showing a live row (a progress bar) in a pipe or log file
PROGRESS_EVERY = 5.0
#: the columns of a terminal whose size is unknown (as Python's ``shutil`` and tqdm take it)
DEFAULT_WIDTH = 80
_SGR = re.compile(r"\x1b\[[0-9;]*m")
_RESET = "\x1b[0m"


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def tagged(prefix: str, line: str) -> str:
    """``line`` with the stream's ``prefix``, unless it already starts with it (torch's
    excepthook writes ``[rankN]: `` before each traceback line: one tag is enough)."""
    return line if prefix and line.startswith(prefix) else prefix + line


def terminal_width(columns: int | None) -> int:
    """The width to draw on, from the columns a terminal reports: 0 (a pseudo-terminal nobody
    sized: ``script -q -c``, CI runners, ``docker -t``, ``kubectl -t``; ``stty size`` says ``0
    0``) or None (the size cannot be read) is unknown, so :data:`DEFAULT_WIDTH`."""
    return columns if columns and columns > 0 else DEFAULT_WIDTH


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width - 1`` columns (colour sequences take none, wide East Asian
    characters two), so that the cursor never reaches the last column and the row never
    wraps."""
    room = max(1, width - 1)
    out: list[str] = []
    used = pos = 0
    coloured = False
    while pos < len(text):
        match = _SGR.match(text, pos)
        if match is not None:
            out.append(match.group(0))
            coloured = True
            pos = match.end()
            continue
        columns = 2 if unicodedata.east_asian_width(text[pos]) in "WF" else 1
        if used + columns > room:
            return "".join(out) + (_RESET if coloured else "")
        out.append(text[pos])
        used += columns
        pos += 1
    return "".join(out)


class TerminalView:
    """One terminal shared by many streams (see the module docstring). ``width``: its columns,
    which the caller keeps up to date."""

    def __init__(self, width: int = DEFAULT_WIDTH) -> None:
        self.width = width
        self._live: dict[int, list[str]] = {}
        self._drawn = 0  # rows of the live block on screen; the cursor ends the last one

    def update(self, key: int, prefix: str, lines: Sequence[str], live: Sequence[str],
               now: float = 0.0) -> bytes:
        """What to write after stream ``key`` finished ``lines`` and now shows ``live``."""
        rows = [tagged(prefix, row) for row in live]
        if not lines and self._live.get(key, []) == rows:
            return b""
        if rows:
            self._live[key] = rows
        else:
            self._live.pop(key, None)
        text = self._clear() + "".join(f"{tagged(prefix, line)}\n" for line in lines) + \
            self._draw()
        return _encode(text)

    def _clear(self) -> str:
        if not self._drawn:
            return ""
        up = f"\x1b[{self._drawn - 1}A" if self._drawn > 1 else ""
        self._drawn = 0
        return f"\r{up}\x1b[J"

    def _draw(self) -> str:
        rows = [fit(row, self.width) for key in sorted(self._live) for row in self._live[key]]
        self._drawn = len(rows)
        return "\n".join(rows)


class LogView:
    """One pipe or log file shared by one or more streams (see the module docstring)."""

    def __init__(self, every: float = PROGRESS_EVERY) -> None:
        self._every = every
        self._due: dict[int, float] = {}
        self._shown: dict[int, list[str]] = {}

    def update(self, key: int, prefix: str, lines: Sequence[str], live: Sequence[str],
               now: float = 0.0) -> bytes:
        """What to write after stream ``key`` finished ``lines`` and now shows ``live``."""
        shown = self._shown.get(key, [])
        out: list[str] = []
        for line in lines:
            if line in shown:
                shown.remove(line)  # this final state was shown while live
            else:
                out.append(line)
        if not live:
            self._due.pop(key, None)
        elif now >= self._due.get(key, now):
            fresh = [row for row in live if row not in shown]
            if fresh:
                out += fresh
                shown = [*shown, *fresh]
                self._due[key] = now + self._every
        self._shown[key] = [row for row in shown if row in live]
        text = "".join(f"{tagged(prefix, line)}\n" for line in out)
        return _encode(_SGR.sub("", text) if "\x1b" in text else text)
