"""Fault schedules for elastic jobs on nodes in network namespaces: what happens to which node,
when, for how long (pure: no process, no clock; :func:`generate` draws one from a seed).

A :class:`Fault` names its node by role, resolved when it happens (tests/integration/faults/
runner.py): ``server`` is the node that serves the rendezvous (rank 0's node, where the job's
last step was logged), ``other`` the ``pick``-th (modulo) of the other live nodes. Kinds:

* ``kill``: SIGKILL of the node's whole process tree (a machine that dies); for good.
* ``freeze``: SIGSTOP of the tree, SIGCONT after ``duration`` (a stalled machine).
* ``stuck``: the node's rank sleeps in user code from its next step (the job's hang timeout,
  :data:`HANG_TIMEOUT`, evicts the node); for good. Only ``other`` (the rank that sleeps is
  not rank 0) and never with another fault at once (a restart for another loss would end the
  sleeping rank before the hang timeout: no eviction).
* ``cut``: the node's link down, up again after ``duration`` (a partition that heals).
* ``replace``: killed as ``kill``, started again with the same command after ``duration``.

Faults with the same ``at`` happen together (on distinct nodes). :func:`generate` keeps at least
``min_nodes`` nodes that are neither killed nor evicted for good, spaces the faults so that each
recovery can be told from the next, and makes every transient fault last longer than the
rendezvous's beat timeout (3 s), so that each is a loss the job must see.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

KINDS = ("kill", "freeze", "stuck", "cut", "replace")
#: faults that take a node away for good
PERMANENT = frozenset({"kill", "stuck"})
#: faults that end by themselves after ``duration`` (resumed, healed, started again)
TRANSIENT = frozenset({"freeze", "cut", "replace"})
TARGETS = ("server", "other")
#: a transient loss lasts at least this long (over the default beat timeout of 1 s x 3)
MIN_OUTAGE = 5.0
#: seconds between one fault's end and the next fault: room for the recovery
GAP = (10.0, 14.0)
#: the jobs' ``--hang-timeout``: a stuck rank's node is evicted this long after it stuck
HANG_TIMEOUT = 10.0


@dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` to the node ``target`` (``pick``) ``at`` seconds into the job."""

    at: float
    kind: str
    target: str
    pick: int = 0
    duration: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.target not in TARGETS:
            raise ValueError(f"no such fault: {self.kind} of {self.target}")
        if self.kind == "stuck" and self.target == "server":
            raise ValueError("a stuck rank is another node's (rank 0 is the server's)")
        if (self.kind in TRANSIENT) != (self.duration > 0):
            wanted = "a duration is wanted" if self.kind in TRANSIENT else "no duration is wanted"
            raise ValueError(f"{self.kind}: {wanted}")

    @property
    def end(self) -> float:
        return self.at + self.duration

    def describe(self) -> str:
        whom = "server" if self.target == "server" else f"other#{self.pick}"
        lasting = f" for {self.duration:.1f}s" if self.duration else ""
        return f"{self.at:.1f}s {self.kind} {whom}{lasting}"


@dataclass(frozen=True)
class Schedule:
    """A job of ``nodes`` nodes (``--nnodes min_nodes:nodes``) and the faults it meets."""

    seed: int
    nodes: int
    min_nodes: int
    faults: tuple[Fault, ...]

    @property
    def end(self) -> float:
        """When the last fault is over (seconds into the job)."""
        return max((f.end for f in self.faults), default=0.0)

    @property
    def final_nodes(self) -> int:
        """How many nodes the job should run on once every fault is over."""
        return self.nodes - sum(f.kind in PERMANENT for f in self.faults)

    def describe(self) -> str:
        faults = ", ".join(f.describe() for f in self.faults) or "no fault"
        return f"seed {self.seed}: {self.nodes} nodes (min {self.min_nodes}): {faults}"


def _draw_kind(rng: random.Random, permanent_left: int, alone: bool = True) -> str:
    kinds = [k for k in KINDS if (k not in PERMANENT or permanent_left > 0)
             and (k != "stuck" or alone)]
    return rng.choice(kinds)


def _draw_fault(rng: random.Random, at: float, kind: str, target: str | None = None) -> Fault:
    if target is None:
        target = "other" if kind == "stuck" else rng.choice(TARGETS)
    if kind == "replace":
        duration = round(rng.uniform(1.0, 4.0), 1)
    elif kind in TRANSIENT:
        duration = round(rng.uniform(MIN_OUTAGE, 2 * MIN_OUTAGE), 1)
    else:
        duration = 0.0
    return Fault(at, kind, target, rng.randrange(4), duration)


def generate(seed: int, *, nodes: int | None = None, faults: int | None = None) -> Schedule:
    """A schedule drawn from ``seed`` alone: 3 or 4 nodes (min 2), 1-3 fault events, one of
    them possibly two faults at once (never two at the server, never both for good)."""
    rng = random.Random(seed)
    nodes = nodes if nodes is not None else rng.choice((3, 4))
    min_nodes = 2
    events = faults if faults is not None else rng.randint(1, 3)
    permanent_left = nodes - min_nodes
    drawn: list[Fault] = []
    at = round(rng.uniform(2.0, 5.0), 1)
    for _ in range(events):
        alive = min_nodes + permanent_left  # nodes not lost for good before this event
        first = _draw_fault(rng, at, _draw_kind(rng, permanent_left))
        permanent_left -= first.kind in PERMANENT
        group = [first]
        if alive >= 3 and first.kind != "stuck" and rng.random() < 0.3:
            kind = _draw_kind(rng, permanent_left if first.kind not in PERMANENT else 0,
                              alone=False)
            second = _draw_fault(rng, at, kind,
                                 "other" if first.target == "server" else None)
            permanent_left -= second.kind in PERMANENT
            group.append(second)
        drawn.extend(group)
        settle = HANG_TIMEOUT if first.kind == "stuck" else 0.0
        at = round(max(f.end for f in group) + settle + rng.uniform(*GAP), 1)
    return Schedule(seed, nodes, min_nodes, tuple(drawn))
