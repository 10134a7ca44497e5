"""When a rendezvous round closes, and who is in it (pure; no torch, no sockets).

The store's server (:mod:`.server`) holds the job's small state: the members of the last round
in their order, the nodes waiting for the next one, and when the waiting began. These functions
are its decisions, unit-tested in milliseconds:

* :func:`round_closes`: new nodes alone never close a round while a node of the round before
  is alive and has not asked for one (the job runs: the newcomers wait for its next round,
  however many they are); a round closes at once when MAX nodes wait, or after a change when every
  node of the round before that is still alive has rejoined and no new node waits (nothing can
  arrive: no last call). The last call is waited for only where nodes may still arrive: the
  first round below MAX, and a round a new node waits for. A node of the round before that has
  not rejoined within the close timeout is left out.
* :func:`has_quorum`: one world at every moment. A round that follows another closes only when
  the nodes of the round before that rejoin it are a strict majority of that round's nodes not
  proven dead, or exactly half of them including the first of them in the round's order (a fixed
  tie-break: the serving node is first in every round it is in, see :func:`members_of`, so in a
  two-node job the node serving the rendezvous wins). A node is *proven dead* when its
  connection ended without a word (EOF or RST with no ``dropped`` or ``abandon`` before it), its
  rendezvous port refused a connection, or it said ``leave`` or was evicted (a hello read after
  its sender closed its side is stale: unanswered, it names no connection, so its end proves
  nothing; a node gives up on a silent server that way): the kernel closed
  its helper's sockets, and a ``unirank run`` whose helper ended stops its workers and ends (the
  helper dies with its ``unirank run`` by its parent-death signal). Silence (a hung machine, a
  cut link) proves nothing. A node that heard nothing from its server for
  :func:`.conf.fence_after` stops its workers before that server declares it lost
  (:func:`.conf.lost_after`). Two groups of one round's nodes that lost each other can therefore
  never both close a round: at most one holds a quorum, and the other waits (its workers
  stopped) until it reaches the job again. A node never goes back in the job's history
  (:func:`behind`): its hello names the last round it took part in, and a server at an earlier
  round (the frozen server resumed, the other side of a split) refuses it, so a node that voted
  for a round never votes again over the round before it, where a quorum of that older round
  would not meet this one's. A two-node job gives up telling a stalled or cut-off serving node
  from a dead one: the other waits for it to come back, or to be replaced
  (:func:`two_node_note`).
* :func:`members_of`: the next round's nodes: the serving node, then those of the round
  before in their order, then the new ones in the order they came, at most MAX.
* :func:`successor`: which node serves the rendezvous once the node serving it is lost: the
  first node of the last round's list that is not known lost. Every node holds the same list
  (the round's answer carries it), so the survivors agree without talking to each other.
* :func:`follows`: whether a server redirects its nodes to another server of the same job.
  A successor serves on its own address; a node started again with the original command (a
  replaced pod 0 whose name now resolves to a new address, a requeued node) finds nothing at
  the endpoint and serves a fresh rendezvous there. So the server of a job that moved keeps
  probing the endpoint (its name resolved afresh, once per beat interval) and tells whatever
  serves there where the job runs; that server follows when it serves the same job at an
  earlier round (a fresh one is at round -1): it sends its nodes there (they join at the
  job's next round) and from then on answers every hello at the endpoint with the job's
  address. Nothing waits on one node: any successor probes, any endpoint server follows.
  Probes go both ways (the probed server answers where it is) and also to the other
  members' rendezvous ports, so the sides of a split meet again once it heals: the side
  behind follows the side that closed a later round, and where neither did, the side
  whose server comes later in the round's order follows the other (at the same place, the
  one whose node's name sorts later: a strict order, so they always meet).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

__all__ = ["Pending", "Served", "behind", "follows", "has_quorum", "members_of", "place_of",
           "rebuilt", "round_closes", "successor", "two_node_note"]


@dataclass(frozen=True)
class Pending:
    """A round being formed, as the server sees it at one moment."""

    #: the nodes of the round before (empty: this is the job's first round), alive or not
    before: tuple[str, ...]
    #: the nodes alive now (connected, beating)
    alive: frozenset[str]
    #: the nodes waiting for this round, in the order they came
    waiting: tuple[str, ...]
    #: seconds since the first node of this round came, and since MIN nodes waited
    open_for: float
    min_for: float
    #: the nodes of the round before proven dead (see :func:`has_quorum`)
    dead: frozenset[str] = frozenset()


def has_quorum(before: Sequence[str], rejoined: Collection[str],
               dead: Collection[str]) -> bool:
    """Whether the nodes ``rejoined`` may form the round after ``before`` (its nodes in their
    order): a strict majority of its nodes not ``dead``, or exactly half including the first
    of them (see the module docstring). True for a first round and where every node of the
    round before is dead (nothing is left to split from)."""
    dead, rejoined = frozenset(dead), frozenset(rejoined)
    voters = [n for n in before if n not in dead]
    count = sum(1 for n in voters if n in rejoined)
    if 2 * count == len(voters):
        return not voters or voters[0] in rejoined
    return 2 * count > len(voters)


def behind(server_round: int, node_round: object) -> bool:
    """Whether a server at ``server_round`` is behind a node that took part in (or learned)
    ``node_round``: it serves a side of the job that lost the rest, and the node must not join
    it (see the module docstring: a node never goes back in the job's history)."""
    return isinstance(node_round, int) and node_round > server_round


def two_node_note(min_nodes: int, max_nodes: int) -> str | None:
    """The one line an elastic job of at most two nodes says at its start (what
    :func:`has_quorum` gives up there); None for any other job."""
    if max_nodes != 2 or min_nodes >= max_nodes:
        return None
    return ("an elastic job of 2 nodes cannot tell a stalled or cut-off node serving the "
            "rendezvous from a lost one: the other waits for it to come back or be replaced "
            "(one world at every moment)")


def round_closes(p: Pending, *, min_nodes: int, max_nodes: int, last_call: float,
                 close_timeout: float) -> bool:
    """Whether the round ``p`` closes now (see the module docstring)."""
    waiting = [n for n in p.waiting if n in p.alive]
    if not has_quorum(p.before, waiting, p.dead):
        return False  # the other side of a split may hold the majority: never two worlds
    before, waits = frozenset(p.before), frozenset(waiting)  # thousands of nodes: sets
    if before and before.isdisjoint(waits) and not before.isdisjoint(p.alive):
        return False  # the job runs and none of its nodes asked for a round: newcomers wait
    if len(waiting) >= max_nodes:
        return True
    if len(waiting) < min_nodes:
        return False
    if not p.before:  # the first round: more may still come
        return p.min_for >= last_call
    missing = [n for n in p.before if n in p.alive and n not in waits]
    if missing:
        return p.open_for >= close_timeout
    if not waits <= before:  # a new node: others may come with it
        return p.min_for >= last_call
    return True


def members_of(before: Sequence[str], waiting: Sequence[str], alive: frozenset[str],
               max_nodes: int, serving: str | None = None) -> tuple[str, ...]:
    """The next round's nodes: the node ``serving`` the rendezvous where it waits, then the
    round before's that wait, in their order, then the new ones in the order they came, at most
    ``max_nodes``. The serving node comes first so that :func:`has_quorum`'s tie-break falls
    to it: the node that holds the round is the one a two-node job keeps."""
    waits, was = frozenset(waiting), frozenset(before)
    gone = [n for n in before if n not in waits or n not in alive]
    came = [n for n in waiting if n not in was and n in alive]
    return rebuilt(before, gone, came, serving)[:max_nodes]


def rebuilt(before: Sequence[str], gone: Sequence[str], came: Sequence[str],
            serving: str | None) -> tuple[str, ...]:
    """The order of a round after ``before``: its nodes not ``gone``, in their order, then
    those that ``came``, the ``serving`` node first where it is one of them (the one rule of
    :func:`members_of`, and of a node rebuilding a round sent as a change: :mod:`.change`)."""
    left = frozenset(gone)
    ordered = [n for n in before if n not in left] + list(came)
    if serving in ordered:
        ordered.remove(serving)
        ordered.insert(0, serving)
    return tuple(ordered)


def successor(members: Sequence[str], failed: Collection[str]) -> str | None:
    """The node that serves the rendezvous next: the first of the last round's ``members`` (in
    the round's order) not in ``failed`` (the node that served it, and any found unreachable
    since); None when none is left."""
    return next((m for m in members if m not in failed), None)


def place_of(node: str, members: Sequence[str]) -> int:
    """A server's place in its last round's order (:class:`Served`): its node's index there,
    else the round's length (a node that was in no round comes after all of them). The one
    rule a server says of itself and a pointer to it says of it."""
    return members.index(node) if node in members else len(members)


@dataclass(frozen=True)
class Served:
    """A rendezvous server as a probe sees it: its job, its last round, its node."""

    job: str
    round: int
    server: str
    #: the server's node's place in its last round's order (its length where it is not in it)
    place: int = 0


def follows(here: Served, there: Served, dead: Collection[str] = ()) -> bool:
    """Whether the server ``here`` sends its nodes to ``there`` (see the module docstring): the
    same job, another server, a later round (the job that ran on; a fresh server is at round
    -1), or the same round and a node earlier in its order (two sides of a split where
    neither held a quorum: they meet at the first one's server), or the same round and place
    and a node whose name sorts first (two servers that each count themselves first of a
    round of that number never meet otherwise). The rule is a strict order, so two servers
    never send their nodes to each other, and any two of a job's servers that closed a round
    meet. Never to a server ``here`` knows proven dead (``dead``): a place heard second-hand
    (an endpoint server that followed it once still names it) is not proof that it runs."""
    if here.job != there.job or here.server == there.server or there.server in dead:
        return False
    if there.round != here.round:
        return there.round > here.round
    return here.round >= 0 and (there.place, there.server) < (here.place, here.server)
