"""Which node's link is slow, by the round trip of its connection to the rendezvous's server
(the rule is pure; :func:`tcp_rtt_us` reads the kernel's figure; no environment variable).

A link cut in bandwidth (a throttled port, a saturated or degraded NIC) slows every rank's
collectives alike, so the straggler rule (:mod:`unirank.hang.slowrank`: who keeps the others
waiting) cannot see it. Its queue can: while the job's traffic fills the slow link, each packet
through it waits behind that traffic, and so do the rendezvous's beats and their
acknowledgements. The server reads the kernel's smoothed round trip of each member's
connection (``TCP_INFO``'s ``tcpi_rtt``: no userspace delay in it) at every look
(:meth:`.keeper.RoundKeeper.say_slow_link`), keeps the least of each one's last
:data:`WINDOW`, and asks :func:`odd_link` which node stands out:

a node whose round trip is at least :data:`FACTOR` times the median of the other nodes' (and
at least :data:`FLOOR_US`): its link is slow. The server's own node is not compared (its
connection never leaves its host), and its own link is not named: every other node's round
trip then rises alike, as it does on a host whose CPUs are all busy (measured: 0.5 ms against
0.04 with every process of three nodes on one core). So it takes two nodes besides the
server's: in a job of two nodes none is named. A node is named once it stood out for
:data:`HOLD_S` seconds, and no longer once it did not for :data:`RECOVER_S` seconds. Measured
in network namespaces (tests/integration/test_slow_link.py), with each node's helper
acknowledging at once (:func:`quick_ack`; a delayed ACK would add up to 40 ms): 0.04-0.15 ms
for a clean veth; 1.2-2.4 ms through one cut to 500 Mbit/s (a tenth of what gloo moved there)
while the job all-reduced.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Mapping

__all__ = ["FACTOR", "FLOOR_US", "HOLD_S", "RECOVER_S", "WINDOW", "odd_link", "quick_ack",
           "tcp_rtt_us"]

#: how many times the others' round trip a slow link's is at least
FACTOR = 8.0
#: the least round trip (microseconds) that counts as slow: above a clean link's blips
FLOOR_US = 1000
#: the round trips (one a second) whose least counts: a lone late acknowledgement (the
#: kernel's figure is an average that keeps it for seconds) is passed over, a queue is not
WINDOW = 5
#: seconds a node stands out before it is named, and does not before it is no longer
HOLD_S = 3.0
RECOVER_S = 8.0


def _median(values: list[int]) -> int:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def odd_link(rtts: Mapping[str, int], local: str) -> tuple[str, int, int] | None:
    """The node whose link is slow (the module's rule), its round trip and the median of the
    other nodes' (microseconds), from each node's round trip (``local``: the server's own
    node, whose connection never leaves its host: not compared); None where no node stands
    out, or with fewer than two other nodes."""
    remote = {node: rtt for node, rtt in rtts.items() if node != local}
    if len(remote) < 2:
        return None
    worst = max(remote, key=lambda node: remote[node])
    base = _median([rtt for node, rtt in remote.items() if node != worst])
    if remote[worst] >= max(FLOOR_US, FACTOR * base):
        return worst, remote[worst], base
    return None


#: where ``tcpi_rtt`` (microseconds) lies in Linux's ``struct tcp_info``, and the bytes read
_TCP_INFO_RTT, _TCP_INFO_SIZE = 68, 104


def tcp_rtt_us(sock: socket.socket) -> int | None:
    """The kernel's smoothed round trip of a TCP connection, microseconds (None where it
    cannot say: not Linux, not TCP, closed)."""
    option = getattr(socket, "TCP_INFO", None)
    if option is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, option, _TCP_INFO_SIZE)
    except OSError:
        return None
    if len(info) < _TCP_INFO_RTT + 4:
        return None
    return int(struct.unpack_from("I", info, _TCP_INFO_RTT)[0])


def quick_ack(sock: socket.socket) -> None:
    """Acknowledge what comes next on ``sock`` at once, not after the delayed ACK's wait (up to
    40 ms, which would be all the server's figure says): each node's rendezvous helper, after
    each read (Linux resets the mode by itself)."""
    option = getattr(socket, "TCP_QUICKACK", None)
    if option is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, option, 1)
