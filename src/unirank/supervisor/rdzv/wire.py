"""One JSON object per line over a TCP connection: the rendezvous's messages between a node's
helper and the store's server (:mod:`.server`, :mod:`.agent`). No torch; reads no environment
variable."""

from __future__ import annotations

import contextlib
import json
import select
import socket
from typing import Any

from unirank.supervisor.rdzv.spec import to_line

__all__ = ["SEND_TIMEOUT", "BadLine", "Lines"]

#: seconds a send may block (a peer that stopped reading is lost after that)
SEND_TIMEOUT = 5.0


class BadLine(ValueError):
    """A peer sent a line that is not a JSON object, or one longer than the limit."""


class Lines:
    """A connection that sends and receives JSON lines; reads only when the caller's selector
    says it is readable. ``max_line``: the longest line taken from the peer (a server's
    connections: a peer's input is checked, :class:`BadLine`); None: any length, and lines that
    are not JSON objects are skipped (a node trusts its server)."""

    def __init__(self, sock: socket.socket, max_line: int | None = None) -> None:
        sock.settimeout(SEND_TIMEOUT)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.max_line = max_line
        self._buffer = b""
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, payload: object) -> bool:
        """Send one message; False when the connection is gone."""
        return self.send_line(to_line(payload))

    def send_line(self, line: bytes) -> bool:
        """Send one message already encoded (:func:`~.spec.to_line`: one message to many
        peers is encoded once); False when the connection is gone."""
        if self.closed:
            return False
        try:
            self.sock.sendall(line)
        except OSError:
            return False
        return True

    def receive(self) -> list[dict[str, Any]] | None:
        """The whole messages that arrived (one read); None when the peer closed;
        :class:`BadLine` (with ``max_line``) for a line too long or not a JSON object."""
        try:
            chunk = self.sock.recv(65536)
        except (BlockingIOError, socket.timeout):
            return []
        except OSError:
            chunk = b""
        if not chunk:
            return None
        self._buffer += chunk
        messages = []
        while b"\n" in self._buffer:
            line, _, self._buffer = self._buffer.partition(b"\n")
            self._check_length(len(line))
            try:
                data = json.loads(line)
            except ValueError:
                data = None
            if isinstance(data, dict):
                messages.append(data)
            elif self.max_line is not None:
                raise BadLine("a line that is not a JSON object")
        self._check_length(len(self._buffer))
        return messages

    def _check_length(self, size: int) -> None:
        if self.max_line is not None and size > self.max_line:
            raise BadLine(f"a line longer than {self.max_line} bytes")

    def waiting(self) -> bool:
        """Whether something from the peer waits to be read (or its end)."""
        try:
            return bool(select.select([self.sock], [], [], 0)[0])
        except (OSError, ValueError):
            return False

    def peer_gone(self) -> bool:
        """Whether the peer already closed its side (its end is queued after what was read): a
        message read now was sent by a process that no longer waits for the answer."""
        try:
            if not select.select([self.sock], [], [], 0)[0]:
                return False  # nothing queued: the peer is still there
            return self.sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.close()
