"""Tagging worker output: ``[rank3]:`` before every line (``unirank run --tag-output``).

The prefix is the global rank, like torchrun's ``--log-line-prefix-template '[rank${rank}]:'``.
"""

from __future__ import annotations

__all__ = ["LinePrefixer", "tag_for"]


def tag_for(rank: int) -> bytes:
    """The prefix of rank ``rank``'s lines."""
    return f"[rank{rank}]:".encode()


class LinePrefixer:
    """Turns a byte stream into lines that start with ``prefix``; keeps a partial last line."""

    def __init__(self, prefix: bytes) -> None:
        self._prefix = prefix
        self._partial = b""

    def feed(self, data: bytes) -> bytes:
        """The complete lines in ``self``'s pending bytes plus ``data``, each prefixed."""
        text = self._partial + data
        cut = text.rfind(b"\n")
        if cut < 0:
            self._partial = text
            return b""
        self._partial = text[cut + 1:]
        lines = text[:cut].split(b"\n")
        return b"".join(self._prefix + line + b"\n" for line in lines)

    def flush(self) -> bytes:
        """The pending partial line, prefixed and ended with a newline ("" when none)."""
        if not self._partial:
            return b""
        out = self._prefix + self._partial + b"\n"
        self._partial = b""
        return out
