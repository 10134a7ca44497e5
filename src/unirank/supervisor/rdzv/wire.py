"""One JSON object per line over a TCP connection: the rendezvous's messages between a node's
helper and the store's server (:mod:`.server`, :mod:`.agent`). No torch; reads no environment
variable."""

from __future__ import annotations

import contextlib
import json
import socket
from typing import Any

from unirank.supervisor.rdzv.spec import to_line

__all__ = ["SEND_TIMEOUT", "Lines"]

#: seconds a send may block (a peer that stopped reading is lost after that)
SEND_TIMEOUT = 5.0


class Lines:
    """A connection that sends and receives JSON lines; reads only when the caller's selector
    says it is readable."""

    def __init__(self, sock: socket.socket) -> None:
        sock.settimeout(SEND_TIMEOUT)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self._buffer = b""
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, payload: object) -> bool:
        """Send one message; False when the connection is gone."""
        if self.closed:
            return False
        try:
            self.sock.sendall(to_line(payload))
        except OSError:
            return False
        return True

    def receive(self) -> list[dict[str, Any]] | None:
        """The whole messages that arrived (one read); None when the peer closed."""
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
            with contextlib.suppress(ValueError):
                data = json.loads(line)
                if isinstance(data, dict):
                    messages.append(data)
        return messages

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.close()
