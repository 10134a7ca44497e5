"""A one-line progress bar on stderr, redrawn in place; stdout keeps the clean table."""

from __future__ import annotations

from typing import TextIO

__all__ = ["CLEAR", "Progress", "bar_line"]

#: back to the start of the line and erase it
CLEAR = "\r\x1b[K"


def bar_line(done: int, total: int, label: str, width: int = 30) -> str:
    """``unirank bench [#######-------]  7/55  all_gather 64K`` (pure)."""
    total = max(total, 1)
    filled = min(width, width * done // total)
    digits = len(str(total))
    return (f"unirank bench [{'#' * filled}{'-' * (width - filled)}] "
            f"{done:>{digits}}/{total}  {label}")


class Progress:
    """Draws :func:`bar_line` on ``stream`` when enabled; :meth:`hide` before writing a table
    line to a terminal shared with stdout, :meth:`close` at the end (erases the bar)."""

    def __init__(self, stream: TextIO, total: int, enabled: bool) -> None:
        self.stream = stream
        self.total = total
        self.enabled = enabled
        self.done = 0
        self._shown = False

    def show(self, label: str) -> None:
        """Draw the bar with ``label`` (what is being measured now)."""
        if self.enabled:
            self.stream.write(CLEAR + bar_line(self.done, self.total, label))
            self.stream.flush()
            self._shown = True

    def step(self) -> None:
        """One more unit of work done."""
        self.done += 1

    def hide(self) -> None:
        """Erase the bar (it is drawn again by the next :meth:`show`)."""
        if self._shown:
            self.stream.write(CLEAR)
            self.stream.flush()
            self._shown = False

    def close(self) -> None:
        """Erase the bar for good."""
        self.hide()
        self.enabled = False
