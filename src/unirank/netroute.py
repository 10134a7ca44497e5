"""Which network interface this host uses to reach an address: the one rule, IPv4 and IPv6.

The kernel picks the route: a UDP socket connected to the address (nothing is sent) tells the
local address it would send from (:func:`route_source`); the interface holding that address
(:func:`~unirank.hostaddrs.holder`, over :func:`~unirank.hostaddrs.interfaces`: this host's
addresses, in :mod:`unirank.hostaddrs`) is the one that routes there.
:func:`interface_towards` puts the two together. Horovod's backend picks its gloo interface
with it, and ``unirank doctor`` suggests NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME from it.

Standard library only (no psutil, no torch). Where the host's addresses cannot be read the
answer is None. A name is looked up through
:func:`unirank.resolve.lookup`, bounded. Reads no environment variables.
"""

from __future__ import annotations

import socket

from unirank.hostaddrs import holder, interfaces, is_own, parse_if_inet6
from unirank.resolve import lookup

__all__ = ["holder", "interface_towards", "interfaces", "is_own", "parse_if_inet6",
           "route_source"]



def _family(address: str) -> socket.AddressFamily:
    """AF_INET6 for an IPv6 literal (it has a colon), else AF_INET (an IPv4 address or a name)."""
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def route_source(address: str) -> str | None:
    """The local address the kernel would send from to reach ``address`` (an IPv4 or IPv6
    address, or a name, which is looked up as IPv4, bounded), or None without a route or for a
    name that does not resolve in time."""
    family = _family(address)
    found = lookup(address, 9, family=family, kind=socket.SOCK_DGRAM).value
    if not found:
        return None
    target = found[0][4]
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(target)  # UDP: no packet is sent, only the route is chosen
            return str(probe.getsockname()[0]).split("%")[0]
    except (OSError, IndexError):
        return None


def interface_towards(address: str) -> str | None:
    """The interface this host uses to reach ``address`` (None when it cannot be told)."""
    return holder(route_source(address), interfaces())
