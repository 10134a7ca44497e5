"""This host's network interfaces and their addresses, and whether an address is this host's.

Standard library only (no psutil, no torch): every IPv4 address through ``SIOCGIFCONF``, every
IPv6 address from ``/proc/net/if_inet6``. Where these Linux interfaces are missing the
addresses are missing too. Looks no name up (:mod:`unirank.resolve` does, and asks this module
whether an address is this host's: :func:`unirank.resolve.require_own`;
:mod:`unirank.netroute` asks which interface routes where). Reads no environment variables.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import ipaddress
import socket
import struct
from collections.abc import Mapping

__all__ = ["holder", "interfaces", "is_own", "parse_if_inet6"]

_SIOCGIFCONF = 0x8912
#: struct ifreq: a 16-byte name, then a union as large as a sockaddr or a struct ifmap
_IFREQ = 16 + max(16, struct.calcsize("LLHBBB0L"))
_IF_INET6 = "/proc/net/if_inet6"


def _ipv4_addresses() -> list[tuple[str, str]]:
    """``(interface, address)`` for every IPv4 address of this host (``SIOCGIFCONF``: secondary
    addresses included; a label such as ``eth0:1`` counts as its interface ``eth0``)."""
    size = 64 * _IFREQ
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        while True:
            buffer = array.array("B", bytes(size))
            request = struct.pack("iP", size, buffer.buffer_info()[0])
            used = struct.unpack("iP", fcntl.ioctl(sock.fileno(), _SIOCGIFCONF, request))[0]
            if used < size:
                break
            size *= 2  # the list may have been cut short
    data = buffer.tobytes()
    return [(data[at:at + 16].split(b"\0")[0].decode().partition(":")[0],
             socket.inet_ntoa(data[at + 20:at + 24])) for at in range(0, used, _IFREQ)]


def parse_if_inet6(text: str) -> list[tuple[str, str]]:
    """``(interface, address)`` for each line of ``/proc/net/if_inet6`` (32 hex digits, index,
    prefix length, scope, flags, name)."""
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 6 and len(fields[0]) == 32:
            found.append((fields[5], str(ipaddress.IPv6Address(bytes.fromhex(fields[0])))))
    return found


def interfaces(if_inet6: str = _IF_INET6) -> dict[str, tuple[str, ...]]:
    """Every network interface of this host and its addresses, IPv4 ones first (an interface
    without an address maps to an empty tuple)."""
    found: dict[str, list[str]] = {name: [] for _index, name in socket.if_nameindex()}
    pairs: list[tuple[str, str]] = []
    with contextlib.suppress(OSError):
        pairs += _ipv4_addresses()
    with contextlib.suppress(OSError), open(if_inet6, encoding="ascii") as handle:
        pairs += parse_if_inet6(handle.read())
    for name, address in pairs:
        if address not in found.setdefault(name, []):
            found[name].append(address)
    return {name: tuple(addresses) for name, addresses in found.items()}


def holder(address: str | None, ifaces: Mapping[str, tuple[str, ...]]) -> str | None:
    """The interface of ``ifaces`` that holds ``address`` (an IPv6 zone such as ``%eth0`` is
    ignored), or None. Pure."""
    if not address:
        return None
    address = address.split("%")[0]
    return next((name for name, addresses in ifaces.items()
                 if any(a.split("%")[0] == address for a in addresses)), None)


def is_own(address: str, ifaces: Mapping[str, tuple[str, ...]]) -> bool:
    """True when ``address`` (an IP address; brackets, an IPv6 zone and an IPv4-mapped IPv6 form
    are accepted) is this host's: loopback, unspecified (``0.0.0.0``, ``::``), or held by one
    of ``ifaces`` (:func:`interfaces`). Nothing is sent. Pure."""
    try:
        ip = ipaddress.ip_address(address.strip("[]").split("%")[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback or ip.is_unspecified:
        return True
    return holder(str(ip), ifaces) is not None
