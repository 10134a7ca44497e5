"""The rendezvous port on node 0, opened by the supervisor before any worker starts.

torch's TCPStore clients that find no listener back off and retry (up to about a second). To spare
the workers that wait, node 0's supervisor binds and listens on MASTER_PORT at once, with no torch,
and hands the socket to rank 0's bootstrap, which builds the TCPStore server on it
(``master_listen_fd``). Clients that connect earlier wait in the listen backlog instead of being
refused.
"""

from __future__ import annotations

import errno
import socket

from unirank.errors import ConfigError

__all__ = ["BACKLOG", "open_store_socket"]

#: the kernel caps this at net.core.somaxconn
BACKLOG = 8192


def _bind(family: int, host: str, port: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def open_store_socket(port: int, *, option: str = "--master-port") -> socket.socket:
    """A socket listening on ``port`` on every address (IPv6 and IPv4 where possible).

    ``port`` 0 binds a free port (read it back with ``getsockname()[1]``); pass the socket to a
    worker with ``Popen(pass_fds=...)``. A port in use is a :class:`ConfigError` naming
    ``option``.
    """
    try:
        try:
            sock = _bind(socket.AF_INET6, "::", port)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise
            sock = _bind(socket.AF_INET, "0.0.0.0", port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                "is already in use on this host (another job, or an earlier run still "
                "closing)",
                variable=option, value=str(port),
                hint="pick another port with --master-port, or on one node drop it (or use "
                "--standalone) to let unirank run choose a free one",
            ) from None
        raise ConfigError(
            f"cannot be opened for the rendezvous store: {exc.strerror or exc}",
            variable=option, value=str(port),
            hint="pick another port with --master-port",
        ) from None
    return sock
