"""One worker stream read as a terminal would show it: finished lines, and the rows still being
drawn (progress bars) (pure; no I/O).

A worker writes to a pipe, but programs such as tqdm draw on it as on a terminal of their own:
``\\r`` goes back to the start of the line, ``\\x1b[A`` moves up a row (tqdm's ``position=``
and nested bars), ``\\x1b[K`` erases to the end of the row. :class:`RankRows` applies these to a
small screen of the stream's own, so that they never reach a terminal that other ranks share:

* A row is *finished* when its line ends (``\\n``) and the stream can no longer go back to it;
  finished lines come out of :meth:`RankRows.feed` in order, each once.
* Until then a row is *live* (:meth:`RankRows.live`): a bar being redrawn, a partial line.
* A stream that never moves up has a screen one row high: every ``\\n`` finishes its row. tqdm
  moves down (``\\n``) before it moves up, so two rows wait for what follows: a blank one (tqdm's
  ``position=``), and one drawn after a ``\\r`` (a bar, under a nested bar); they are finished by
  the next finished line or the end, and reopened by a move up. Once a stream moves up, its
  screen holds up to :data:`MAX_ROWS` rows; a row pushed off the top is finished (blank rows are
  dropped).
* :meth:`RankRows.close` (the end of the stream) finishes what is left: a one-row screen's open
  line, a taller screen's rows that are not blank. Rows that were redrawn lose the spaces that
  padded them.

Other escape sequences are kept in the text (colours) or dropped (other cursor, screen and mode
controls). Bytes that are not UTF-8 pass through unchanged (``surrogateescape``).
"""

from __future__ import annotations

import codecs
import re

__all__ = ["MAX_ROWS", "RankRows"]

#: the most rows a stream that moves its cursor up may keep live
MAX_ROWS = 4
_CSI = re.compile(r"\x1b\[([0-9;?]*)([@-~])")
_CONTROL = re.compile(r"[\r\n\x1b]")


class RankRows:
    """The screen of one worker stream (see the module docstring)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        self._rows: list[str] = [""]
        self._row = 0
        self._col = 0
        self._blanks = 0  # blank finished rows of a one-row screen, not passed on yet
        self._bar = False  # the one-row screen's row was drawn after a "\r"
        self._redraw = False  # a "\r" came: what is written now redraws the row
        self._held: str | None = None  # a bar's finished row that a move up may yet reopen
        self._pending = ""  # an escape sequence cut in two
        #: the stream has moved its cursor up: its screen is taller than one row
        self.positioned = False

    def feed(self, data: bytes) -> list[str]:
        """Apply ``data``; the lines it finished."""
        text = self._pending + self._decoder.decode(data)
        self._pending = ""
        if self._plain(text):
            return self._plain_lines(text)
        done: list[str] = []
        pos = 0
        while pos < len(text):
            match = _CONTROL.search(text, pos)
            end = len(text) if match is None else match.start()
            if end > pos:
                self._write(text[pos:end])
            if match is None:
                break
            pos = self._control(text, match.start(), done)
            if pos < 0:
                self._pending = text[match.start():]
                break
        return done

    def _plain(self, text: str) -> bool:
        """Whether ``text`` is plain lines on a one-row screen with nothing waiting."""
        return (not self.positioned and self._held is None and not self._blanks
                and not self._rows[0] and "\r" not in text and "\x1b" not in text)

    def _plain_lines(self, text: str) -> list[str]:
        """:meth:`feed` of plain lines, at the speed of ``split``."""
        *done, rest = text.split("\n")
        while done and not done[-1]:
            done.pop()
            self._blanks += 1
        if rest:
            self._write(rest)
        return done

    def live(self) -> list[str]:
        """The rows still being drawn that show something (a one-row screen's open line)."""
        held = [self._held] if self._held is not None and self._held.strip() else []
        return held + [row for row in self._rows if row.strip()]

    def close(self) -> list[str]:
        """At the end of the stream: the lines left to pass on."""
        done: list[str] = []
        self._pending = ""  # an escape sequence the stream never finished
        if self.positioned:
            done += [row.rstrip(" ") for row in self._rows if row.strip()]
        else:
            done += self._release()
            if self._rows[0].strip():
                done.append(self._rows[0])
        self._rows, self._row, self._col = [""], 0, 0
        self._bar = self._redraw = False
        return done

    def _release(self) -> list[str]:
        """The held bar row and the blank rows after it, finished now."""
        done = ([self._held] if self._held is not None else []) + [""] * self._blanks
        self._held, self._blanks = None, 0
        return done

    def _write(self, text: str) -> None:
        self._bar = self._bar or self._redraw
        row = self._rows[self._row]
        if self._col > len(row):
            row += " " * (self._col - len(row))
        self._rows[self._row] = row[:self._col] + text + row[self._col + len(text):]
        self._col += len(text)

    def _control(self, text: str, at: int, done: list[str]) -> int:
        """Apply the control at ``text[at]``; where the text goes on (-1: cut in two)."""
        char = text[at]
        if char == "\r":
            self._col = 0
            self._redraw = True
            return at + 1
        if char == "\n":
            self._newline(done)
            return at + 1
        match = _CSI.match(text, at)
        if match is None:
            if len(text) - at < 16 and (len(text) == at + 1 or text[at + 1] == "["):
                return -1  # wait for the rest of the sequence
            return at + 2  # ESC and one character (save or restore the cursor...): dropped
        self._escape(match.group(1), match.group(2), match.group(0))
        return match.end()

    def _escape(self, params: str, final: str, whole: str) -> None:
        count = int(params) if params.isdigit() else 1
        if final == "A":
            self._move_up(count)
        elif final == "B":
            self._row += count
            self._rows += [""] * (self._row + 1 - len(self._rows))
        elif final == "K":
            row = self._rows[self._row]
            self._rows[self._row] = "" if params == "2" else row[:self._col]
        elif final == "m":
            self._write(whole)  # colours stay with the text
        # other controls (cursor visibility, columns, screen clears) do not fit a shared screen

    def _move_up(self, count: int) -> None:
        if not self.positioned:
            self.positioned = True
            # tqdm's position= starts with "\n" before its first move up: those rows were its
            above = ([self._held] if self._held is not None else []) + [""] * self._blanks
            self._rows = above[-(MAX_ROWS - 1):] + self._rows
            self._row = len(self._rows) - 1
            self._held, self._blanks = None, 0
        self._row = max(0, self._row - count)

    def _newline(self, done: list[str]) -> None:
        self._col, self._redraw = 0, False
        if self._row + 1 < len(self._rows):
            self._row += 1
            return
        if not self.positioned:
            line = self._rows[0]
            if self._bar and line.strip():
                done += self._release()
                self._held = line.rstrip(" ")  # a redrawn row's padding
            elif line:
                done += [*self._release(), line]
            else:
                self._blanks += 1
            self._rows[0], self._bar, self._redraw = "", False, False
            return
        self._rows.append("")
        self._row += 1
        if len(self._rows) > MAX_ROWS:
            top = self._rows.pop(0)
            self._row -= 1
            if top.strip():
                done.append(top.rstrip(" "))
