"""The rendezvous port on node 0, opened by the supervisor before any worker starts.

torch's TCPStore clients that find no listener back off and retry (up to about a second). To spare
the workers that wait, node 0's supervisor binds and listens on MASTER_PORT at once, with no torch,
and hands the socket to rank 0's bootstrap, which builds the TCPStore server on it
(``master_listen_fd``). Clients that connect earlier wait in the listen backlog instead of being
refused. The host's name is looked up through :func:`unirank.resolve.lookup`, bounded. Reads no
environment variables.
"""

from __future__ import annotations

import errno
import ipaddress
import socket

from unirank.errors import ConfigError
from unirank.resolve import lookup

__all__ = ["BACKLOG", "open_store_socket", "store_family"]

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
        # The store's event loop accepts until EAGAIN: on a blocking socket its last accept would
        # hang the loop until the next client came (stalls of seconds were measured).
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def store_family(host: str) -> int:
    """The address family to listen on for clients that connect to ``host``.

    IPv4 unless ``host`` is (or resolves only to) IPv6. torch's store looks up the name of every
    peer it accepts, and an IPv4-mapped IPv6 peer (``::ffff:127.0.0.1``) is in no hosts file, so
    a dual-stack socket sends each lookup to DNS; a lost reply there stalls the store for 5 s.
    A name that does not resolve, or not within :data:`unirank.resolve.RESOLVE_TIMEOUT`, gets
    IPv6 (a dual-stack socket, which takes IPv4 clients too).
    """
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        pass
    infos = lookup(host).value
    if infos is None:
        return socket.AF_INET6
    families = {info[0] for info in infos}
    return socket.AF_INET if socket.AF_INET in families or not families else socket.AF_INET6


def open_store_socket(
    port: int, *, host: str = "127.0.0.1", option: str = "--master-port"
) -> socket.socket:
    """A socket listening on ``port`` on every address of the family :func:`store_family` picks
    for ``host`` (an IPv6 socket also takes IPv4 where the system allows).

    ``port`` 0 binds a free port (read it back with ``getsockname()[1]``); pass the socket to a
    worker with ``Popen(pass_fds=...)``. It is non-blocking, as the store's event loop needs.
    A port in use is a :class:`ConfigError` naming ``option``.
    """
    first = store_family(host)
    order = [(first, "::" if first == socket.AF_INET6 else "0.0.0.0")]
    order.append((socket.AF_INET, "0.0.0.0") if first == socket.AF_INET6
                 else (socket.AF_INET6, "::"))
    try:
        try:
            sock = _bind(order[0][0], order[0][1], port)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise
            sock = _bind(order[1][0], order[1][1], port)
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
