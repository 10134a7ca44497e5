"""Which node's link is slow, by the round trips of its beats to the rendezvous's server
(pure; reads no environment variable).

A link cut in bandwidth (a throttled port, a saturated or degraded NIC) slows every rank's
collectives alike, so the straggler rule (:mod:`unirank.hang.slowrank`: who keeps the others
waiting) cannot see it. Its queue can: while the job's traffic fills the slow link, a small
message through it waits behind that traffic. Each node's rendezvous helper times its beats'
echoes from the server (the median of its last beats, :data:`SAMPLES`) and reports it with
its next beat; the server (:meth:`.keeper.RoundKeeper.say_slow_link`) asks :func:`odd_link`
which node stands out:

* a node whose round trip is at least :data:`FACTOR` times the median of the others' (and at
  least :data:`FLOOR_US`): its link is slow;
* every other node's round trip that high against the server's own node's (whose beats never
  leave its host): the server's node's link, which every other node's beats cross.

Two nodes cannot be told apart (either end's link could be slow): none is named. A node is
named once it stood out for :data:`HOLD_S` seconds, and no longer once it did not for
:data:`RECOVER_S` seconds.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["FACTOR", "FLOOR_US", "HOLD_S", "RECOVER_S", "SAMPLES", "odd_link"]

#: how many times the others' round trip a slow link's is at least
FACTOR = 8.0
#: the least round trip (microseconds) that counts as slow: well above a loaded host's jitter
FLOOR_US = 1500
#: beats whose median round trip a node reports
SAMPLES = 8
#: seconds a node stands out before it is named, and does not before it is no longer
HOLD_S = 4.0
RECOVER_S = 8.0


def _median(values: list[int]) -> int:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def odd_link(rtts: Mapping[str, int], local: str) -> tuple[str, int, int] | None:
    """The node whose link is slow (the module's rule), its round trip and the others'
    (microseconds), from each node's reported median round trip (``local``: the server's
    own node); None where no node stands out, or with fewer than three nodes."""
    remote = {node: rtt for node, rtt in rtts.items() if node != local}
    if len(remote) < 2:
        return None
    worst = max(remote, key=lambda node: remote[node])
    base = _median([rtt for node, rtt in rtts.items() if node != worst])
    local_rtt = rtts.get(local)
    if local_rtt is not None and all(rtt >= max(FLOOR_US, FACTOR * local_rtt)
                                     for rtt in remote.values()):
        return local, _median(list(remote.values())), local_rtt
    if remote[worst] >= max(FLOOR_US, FACTOR * base):
        return worst, remote[worst], base
    return None
