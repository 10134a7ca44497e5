"""The network facts doctor reads from this host: who holds a port, the ephemeral port range, a
TCP probe, and timed name look-ups. The interfaces and the route to the master come from
:mod:`unirank.netroute` (the rule Horovod's backend uses too).

Every function bounds its own wait; none imports torch. Linux paths (``/proc``) are read where
they exist and skipped elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from typing import Any

from unirank.resolve import Bounded, lookup
from unirank.resolve import reverse_lookup as _reverse

__all__ = [
    "Lookup",
    "connect_probe",
    "ephemeral_range",
    "port_free",
    "port_owner",
    "resolve",
    "reverse_lookup",
]

@dataclass(frozen=True)
class Lookup:
    """A timed name look-up: ``answer`` (None when it failed), ``error``, ``seconds`` taken
    (the bound when it did not finish)."""

    query: str
    answer: tuple[str, ...] | None
    error: str
    seconds: float


def _error(found: Bounded[Any], limit: float) -> str:
    """Why a bounded look-up has no answer ("" when it has one); a look-up that hangs cannot
    hold doctor up."""
    if found.timed_out:
        return f"no answer within {limit:g} s"
    return "" if found.error is None else (" ".join(str(found.error).split())
                                           or type(found.error).__name__)


def resolve(name: str, limit: float = 5.0) -> Lookup:
    """The IPv4 addresses ``name`` resolves to, or its IPv6 ones where it has no IPv4 one (the
    family unirank's store listens on, :func:`unirank.supervisor.listen.store_family`), timed."""
    found = lookup(name, timeout=limit)
    if found.value is None:
        return Lookup(name, None, _error(found, limit), found.seconds)
    infos = found.value
    ipv4 = {str(info[4][0]) for info in infos if info[0] == socket.AF_INET}
    return Lookup(name, tuple(sorted(ipv4 or {str(info[4][0]) for info in infos})), "",
                  found.seconds)


def reverse_lookup(address: str, limit: float = 3.0) -> Lookup:
    """The name ``address`` maps back to (``gethostbyaddr``, as torch's store does), timed."""
    found = _reverse(address, timeout=limit)
    answer = None if found.value is None else (found.value,)
    return Lookup(address, answer, _error(found, limit), found.seconds)


def connect_probe(address: str, port: int, limit: float = 2.0) -> str:
    """``listening`` (a TCP connect succeeded), ``refused`` (the host answered, nothing
    listens), ``timeout`` (no answer within ``limit``: a firewall or a wrong address) or
    ``unreachable: <error>``."""
    try:
        with socket.create_connection((address, port), timeout=limit):
            return "listening"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return f"unreachable: {exc.strerror or exc}"


def port_free(port: int, address: str = "") -> bool:
    """Whether a TCP socket can bind ``port`` here (as the store server would)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int] | None:
    """The kernel's ephemeral port range (the ports it hands out to outgoing connections)."""
    try:
        with open(path, encoding="ascii") as handle:
            low, high = handle.read().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return None


def _socket_inodes(port: int) -> set[str]:
    """The inodes of the sockets listening (or bound) on ``port``, from /proc/net/tcp{,6}."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table, encoding="ascii") as handle:
            for line in handle.readlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and int(fields[1].rsplit(":", 1)[1], 16) == port \
                        and fields[3] == "0A":  # LISTEN
                    inodes.add(fields[9])
    return inodes


def port_owner(port: int, proc: str = "/proc") -> str | None:
    """``pid P (command)`` of the process listening on ``port``, where /proc lets us read it;
    ``a process of another user`` when the socket is listed but its owner's fds are closed to
    us; None when nothing is found."""
    inodes = _socket_inodes(port)
    if not inodes:
        return None
    targets = {f"socket:[{inode}]" for inode in inodes}
    for pid in filter(str.isdigit, os.listdir(proc)):
        fd_dir = os.path.join(proc, pid, "fd")
        with contextlib.suppress(OSError):
            for fd in os.listdir(fd_dir):
                with contextlib.suppress(OSError):
                    if os.readlink(os.path.join(fd_dir, fd)) in targets:
                        return f"pid {pid} ({_command(proc, pid)})"
    return "a process whose file descriptors this user cannot read"


def _command(proc: str, pid: str) -> str:
    try:
        with open(os.path.join(proc, pid, "cmdline"), "rb") as handle:
            words = handle.read().split(b"\0")
        text = " ".join(w.decode(errors="replace") for w in words if w)
        return " ".join(text.split())[:80] or "?"
    except OSError:
        return "?"
