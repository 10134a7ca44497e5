"""The invariants a fault schedule's run must keep, as pure functions over what the run left:
rank 0's step lines (tests/integration/faults/train.py), the faults as they happened, how each
node's ``unirank run`` ended, what was still running (tests/integration/faults/runner.py).
Each check returns the broken rules as lines, none when it held.

* **One world at a time** (:func:`two_worlds`): a world is one rank 0 process (its node and
  pid); its interval runs from its first step's stamp to its last's. No two intervals overlap.
  A rank 0 frozen in the middle of a step (its all-reduce under way) finishes that step when
  resumed, before anything can stop it (docs/run.md says what a program can do about it):
  that one step (:func:`in_flight`) is left out of this check and the next, and named in the
  report; any further step of that world needs its peers after the freeze, and counts.
* **Steps strictly increasing** (:func:`steps_backwards`): in stamp order every step is above
  the one before (a restart may skip a step whose checkpoint was lost, never repeat one).
* **Each recovery within its bound** (:func:`recoveries`): after a fault is over (killed,
  resumed, healed, started again, a rank stuck; faults at once: the last of them), a step of a
  world that began after the fault began comes within :data:`BOUNDS` seconds.
* **The job ends 0 with at least MIN nodes** (:func:`ending`): its last step is the one that
  saw the stop, at a world of at least MIN nodes (and as many as the schedule leaves); every
  node not killed or evicted by the schedule ended 0.
* **Nothing left running** (:func:`leftovers`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .schedule import HANG_TIMEOUT

#: seconds from a fault's end to the first step of a world that began after the fault began:
#: a lost node is told within the beat timeout (3 s), then a round and the workers' start
#: (seconds on a loaded 2-core machine); a stuck rank first waits out the hang timeout
BOUNDS: Mapping[str, float] = {"kill": 20.0, "freeze": 20.0, "cut": 20.0, "replace": 20.0,
                               "stuck": HANG_TIMEOUT + 20.0}
#: faults that began within this many seconds of each other happened at once
TOGETHER = 1.0
#: seconds before a freeze's recorded end from which its node may stamp again (SIGCONT is sent
#: before the end is taken)
RESUMED = 0.1


@dataclass(frozen=True)
class Step:
    """One line of rank 0's step log."""

    step: int
    world: int
    round: int
    node: int
    pid: int
    mono: float
    stop: bool = False

    @property
    def rank0(self) -> tuple[int, int]:
        """The world this step belongs to: its rank 0 process (node, pid)."""
        return (self.node, self.pid)


@dataclass(frozen=True)
class Happened:
    """A fault as it happened: its kind, the node, when it began and when it was over
    (``time.monotonic()``)."""

    kind: str
    node: int
    start: float
    end: float


@dataclass(frozen=True)
class World:
    rank0: tuple[int, int]
    size: int
    round: int
    first: Step
    last: Step

    def describe(self) -> str:
        return (f"world of {self.size} (rank 0: node {self.rank0[0]} pid {self.rank0[1]}, "
                f"round {self.round}): steps {self.first.step}-{self.last.step}")


def parse_steps(lines: Iterable[str]) -> list[Step]:
    """The steps of a step log's lines (blank ones skipped)."""
    steps = []
    for line in lines:
        if line.strip():
            got = json.loads(line)
            steps.append(Step(int(got["step"]), int(got["world"]), int(got["round"]),
                              int(got["node"]), int(got["pid"]), float(got["mono"]),
                              bool(got.get("stop", False))))
    return steps


def in_flight(steps: Sequence[Step], faults: Sequence[Happened]) -> list[Step]:
    """For each freeze, the first step the frozen node stamped once resumed (from
    :data:`RESUMED` before the freeze's recorded end, which the harness takes after SIGCONT),
    where its world had stepped before the freeze: a step whose all-reduce began before the
    freeze and returns after it (one at most: the next needs its peers, stopped by then)."""
    found = []
    for fault in faults:
        if fault.kind != "freeze":
            continue
        ordered = sorted((s for s in steps if s.node == fault.node), key=lambda s: s.mono)
        before = {s.rank0 for s in ordered if s.mono < fault.start}
        first = next((s for s in ordered if s.mono >= fault.end - RESUMED), None)
        if first is not None and first.rank0 in before:
            found.append(first)
    return found


def trained(steps: Sequence[Step], faults: Sequence[Happened]) -> list[Step]:
    """``steps`` but those :func:`in_flight` at a freeze (see the module docstring)."""
    skip = {id(s) for s in in_flight(steps, faults)}
    return [s for s in steps if id(s) not in skip]


def worlds(steps: Sequence[Step]) -> list[World]:
    """The worlds of these steps, in the order they began."""
    found: dict[tuple[int, int], list[Step]] = {}
    for step in sorted(steps, key=lambda s: s.mono):
        found.setdefault(step.rank0, []).append(step)
    return [World(key, its[0].world, its[0].round, its[0], its[-1])
            for key, its in found.items()]


def two_worlds(steps: Sequence[Step]) -> list[str]:
    """Each pair of worlds whose step intervals overlap."""
    broken = []
    made = worlds(steps)
    for index, one in enumerate(made):
        for other in made[index + 1:]:
            if other.first.mono <= one.last.mono:
                broken.append(f"two worlds at once: {one.describe()} and {other.describe()} "
                              f"(overlap {one.last.mono - other.first.mono:.1f} s)")
    return broken


def steps_backwards(steps: Sequence[Step]) -> list[str]:
    """Each step, in stamp order, not above the one before."""
    ordered = sorted(steps, key=lambda s: s.mono)
    return [f"step {after.step} (node {after.node} pid {after.pid}) came after step "
            f"{before.step} (node {before.node} pid {before.pid})"
            for before, after in zip(ordered, ordered[1:]) if after.step <= before.step]


def recovery_times(steps: Sequence[Step], faults: Sequence[Happened]) -> list[float | None]:
    """For each fault, seconds from its end to the first step of a world that began after it
    began (None: no such step). Faults that began together (within :data:`TOGETHER`) end
    together, when the last of them ends: the job may need every node back."""
    began = {w.rank0: w.first.mono for w in worlds(steps)}
    ordered = sorted(steps, key=lambda s: s.mono)
    times: list[float | None] = []
    for fault in faults:
        end = max(f.end for f in faults if abs(f.start - fault.start) <= TOGETHER)
        after = next((s for s in ordered
                      if s.mono > end and began[s.rank0] > fault.start), None)
        times.append(None if after is None else after.mono - end)
    return times


def recoveries(steps: Sequence[Step], faults: Sequence[Happened],
               bounds: Mapping[str, float] = BOUNDS) -> list[str]:
    """Each fault after which the job did not step in a new world within its bound."""
    broken = []
    for fault, took in zip(faults, recovery_times(steps, faults)):
        bound = bounds[fault.kind]
        if took is None or took > bound:
            said = "never" if took is None else f"after {took:.1f} s"
            broken.append(f"{fault.kind} of node {fault.node}: a new world stepped {said} "
                          f"(bound {bound:g} s)")
    return broken


def ending(steps: Sequence[Step], codes: Mapping[int, int | None], *, min_nodes: int,
           final_nodes: int, spared: Iterable[int]) -> list[str]:
    """How the job ended: its last step saw the stop at a world of ``final_nodes`` (at least
    ``min_nodes``); each node of ``spared`` (not killed or evicted for good) ended 0
    (``codes``: each node's last ``unirank run``'s exit code, None if it never ended)."""
    broken = []
    if not steps:
        return ["no step was logged"]
    last = max(steps, key=lambda s: s.mono)
    if not last.stop:
        broken.append(f"the last step ({last.step}) was not the one that saw the stop")
    if last.world < max(min_nodes, final_nodes):
        broken.append(f"the job ended at a world of {last.world}, not "
                      f"{max(min_nodes, final_nodes)}")
    for node in sorted(spared):
        if codes.get(node) != 0:
            broken.append(f"node {node} ended with {codes.get(node)}, not 0")
    return broken


def leftovers(left: Mapping[int, str]) -> list[str]:
    """Each process still running once the job ended (pid: command line)."""
    return [f"left running: pid {pid} {command}" for pid, command in sorted(left.items())]
