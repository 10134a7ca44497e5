"""One JSON object per line over a TCP connection: the rendezvous's messages between a node's
helper and the store's server (:mod:`.server`, :mod:`.agent`). No torch; reads no environment
variable."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import time
from collections import deque
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
    are not JSON objects are skipped (a node trusts its server). ``queued``: sends never block
    (a server's connections: one slow peer must not hold up the others); what the kernel does
    not take at once waits in order, sent by :meth:`flush` when the socket is writable, and
    :meth:`stalled_for` says how long nothing of it went."""

    def __init__(self, sock: socket.socket, max_line: int | None = None, *,
                 queued: bool = False) -> None:
        sock.settimeout(0.0 if queued else SEND_TIMEOUT)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.max_line = max_line
        self.queued = queued
        self._buffer = b""
        #: what waits to be sent (shared bytes: one round's line to thousands of peers is
        #: held once), and since when nothing of it went
        self._out: deque[memoryview] = deque()
        self._stalled: float | None = None
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
        if self.queued:
            self._out.append(memoryview(line))
            return self.flush()
        try:
            self.sock.sendall(line)
        except OSError:
            return False
        return True

    def flush(self) -> bool:
        """Send what waits, as far as the kernel takes it now; False when the connection is
        gone."""
        while self._out:
            try:
                sent = self.sock.send(self._out[0])
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._out.clear()
                return False
            self._stalled = None
            if sent == len(self._out[0]):
                self._out.popleft()
            else:
                self._out[0] = self._out[0][sent:]
        if self._out and self._stalled is None:
            self._stalled = time.monotonic()
        return True

    def pending(self) -> bool:
        """Whether something waits to be sent."""
        return bool(self._out)

    def stalled_for(self, now: float) -> float:
        """Seconds since something waits to be sent and nothing of it went (0: none waits)."""
        return 0.0 if self._stalled is None else now - self._stalled

    def receive(self) -> list[dict[str, Any]] | None:
        """The whole messages that arrived (one read); None when the peer closed;
        :class:`BadLine` (with ``max_line``) for a line too long or not a JSON object."""
        try:
            chunk = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError, socket.timeout):
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
            return _readable(self.sock)
        except (OSError, ValueError):
            return False

    def peer_gone(self) -> bool:
        """Whether the peer already closed its side (its end is queued after what was read): a
        message read now was sent by a process that no longer waits for the answer."""
        try:
            if not _readable(self.sock):
                return False  # nothing queued: the peer is still there
            return self.sock.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.close()


def _readable(sock: socket.socket) -> bool:
    """Whether ``sock`` has something to read (or its end) now; ``poll``, not ``select``: a
    server of thousands of nodes holds descriptors past select's 1024."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))
