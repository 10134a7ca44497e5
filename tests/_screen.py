"""A tiny terminal for tests: the text a screen (with its scrollback) holds after a byte stream.

It knows what :mod:`unirank.supervisor.console` and tqdm write: printable text (wrapping at the
last column), ``\\r``, ``\\n`` (a pty's ONLCR: back to the first column too), ``\\x1b[nA`` and
``\\x1b[nB`` (up, down), ``\\x1b[K`` (erase to the end of the row; ``\\x1b[2K``: the whole
row), ``\\x1b[J`` (erase to the end of the screen); other escape sequences (colours) are
ignored. It has no screen height, so none of a real terminal's scrollback rules: what tmux keeps
is counted by tests/supervisor/test_bars_in_tmux.py.
"""

from __future__ import annotations

import re

_CSI = re.compile(r"\x1b\[([0-9;?]*)([@-~])")


def screen(data: bytes, width: int = 80) -> list[str]:
    """The rows a terminal ``width`` columns wide shows after ``data``, scrollback included,
    without trailing blanks and trailing blank rows."""
    rows: list[list[str]] = [[]]
    row = col = 0
    text = data.decode("utf-8", "replace")
    pos = 0
    while pos < len(text):
        match = _CSI.match(text, pos)
        if match is not None:
            count = int(match[1]) if match[1].isdigit() else 1
            if match[2] == "A":
                row = max(0, row - count)
            elif match[2] == "B":
                row += count
            elif match[2] == "K" and match[1] == "2":
                rows[row].clear()
            elif match[2] == "K":
                del rows[row][col:]
            elif match[2] == "J":
                del rows[row][col:]
                del rows[row + 1:]
            pos = match.end()
        else:
            char = text[pos]
            pos += 1
            if char == "\r":
                col = 0
            elif char == "\n":
                row, col = row + 1, 0
            else:
                if col >= width:
                    row, col = row + 1, 0
                rows += [[] for _ in range(row + 1 - len(rows))]
                line = rows[row]
                line += [" "] * (col - len(line))
                line[col:col + 1] = [char]
                col += 1
        rows += [[] for _ in range(row + 1 - len(rows))]
    shown = ["".join(line).rstrip() for line in rows]
    while shown and not shown[-1]:
        shown.pop()
    return shown
