"""Run one fault schedule (tests/integration/faults/schedule.py) for real and check it.

Each node is one ``unirank run --nnodes MIN:MAX --nproc-per-node 1 --rdzv-backend c10d
--rdzv-endpoint 10.77.0.1:29400 --local-addr 10.77.0.N`` in a network namespace of its own
(tests/integration/_netns.py), running tests/integration/faults/train.py; node 1 is the
endpoint's. The clock of the schedule starts at the first step of a world of every node. Faults
happen at their time; a role (``server``: the node of the last logged step, rank 0's; ``other``)
is resolved then, among the nodes neither lost for good nor in a fault. Once the last fault is
over the runner waits for a world of as many nodes as the schedule leaves (a few steps of it),
then asks the job to stop (the file ``stop``), waits for every node's ``unirank run`` to end,
notes what still runs in the namespaces, kills it, and checks the invariants
(tests/integration/faults/checks.py). Everything of a run is in its folder: ``steps.jsonl``,
``node<N>.<start>.log``, ``faults.jsonl``.

Environment variables read: the caller's environment, without launcher variables, for the
nodes (``PYTHONPATH`` reaches ``unirank``); each node gets ``FAULT_NODE``, a ``TMPDIR`` of its
own in the run's folder, and ``GLOO_SOCKET_IFNAME=eth0`` (every namespace has the machine's
host name, which does not resolve to the node's address).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from _netns import IFNAME, Net, address

from _procs import launcher_free_environ, process_tree, wait_gone

from . import checks
from .checks import Happened, Step
from .schedule import HANG_TIMEOUT, PERMANENT, Fault, Schedule

TRAIN = Path(__file__).resolve().with_name("train.py")
PORT = 29400
#: from the nodes' start to the first step of a world of all of them
START_TIMEOUT = 180.0
#: from the stop to every node's end
END_TIMEOUT = 60.0
#: steps of the final world before the stop
SETTLE_STEPS = 3
POLL = 0.1
#: broken invariants a report shows (the rest are counted)
SHOWN = 8


@dataclass
class Outcome:
    """What one schedule's run left, and the invariants it broke."""

    schedule: Schedule
    folder: Path
    steps: list[Step]
    happened: list[Happened]
    codes: dict[int, int | None]
    spared: set[int]
    left: dict[int, str]
    skipped: list[str] = field(default_factory=list)

    def violations(self) -> list[str]:
        trained = checks.trained(self.steps, self.happened)
        return [*checks.two_worlds(trained), *checks.steps_backwards(trained),
                *checks.recoveries(self.steps, self.happened),
                *checks.ending(self.steps, self.codes, min_nodes=self.schedule.min_nodes,
                               final_nodes=self.schedule.final_nodes, spared=self.spared),
                *checks.leftovers(self.left)]

    def report(self) -> str:
        took = checks.recovery_times(self.steps, self.happened)
        lines = [self.schedule.describe()]
        for fault, seconds in zip(self.happened, took):
            said = "none" if seconds is None else f"{seconds:.1f} s"
            lines.append(f"  {fault.kind} node {fault.node}: recovered {said}")
        lines += [f"  skipped: {s}" for s in self.skipped]
        lines += [f"  in flight at a freeze (stamped once resumed): step {s.step} of node "
                  f"{s.node} pid {s.pid}" for s in checks.in_flight(self.steps, self.happened)]
        broken = self.violations()
        lines += [f"  BROKEN: {v}" for v in broken[:SHOWN]] or ["  ok"]
        if len(broken) > SHOWN:
            lines.append(f"  ... and {len(broken) - SHOWN} more broken")
        return "\n".join(lines)


class Job:
    """The nodes of one schedule's job, in ``net``; their folder is ``folder``."""

    def __init__(self, net: Net, folder: Path, schedule: Schedule) -> None:
        self.net, self.folder, self.schedule = net, folder, schedule
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.starts = dict.fromkeys(net.nodes, 0)
        self.gone: set[int] = set()  # killed or evicted for good
        self.busy: set[int] = set()  # in a fault now

    def command(self, node: int) -> list[str]:
        return [sys.executable, "-m", "unirank", "run", "--nnodes",
                f"{self.schedule.min_nodes}:{self.schedule.nodes}", "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{address(1)}:{PORT}",
                "--rdzv-id", "faults", "--local-addr", address(node), "--max-restarts", "100",
                "--hang-timeout", f"{HANG_TIMEOUT:g}", str(TRAIN), str(self.folder)]

    def start(self, node: int) -> None:
        tmp = self.folder / f"tmp{node}"
        tmp.mkdir(exist_ok=True)
        env = launcher_free_environ({"FAULT_NODE": str(node), "TMPDIR": str(tmp),
                                     "GLOO_SOCKET_IFNAME": IFNAME, "PYTHONUNBUFFERED": "1"})
        log = self.folder / f"node{node}.{self.starts[node]}.log"
        self.starts[node] += 1
        with log.open("wb") as out:
            self.procs[node] = self.net.popen(node, self.command(node), env=env, stdout=out,
                                              stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, start_new_session=True)

    def signal_tree(self, node: int, sig: signal.Signals) -> None:
        """``sig`` to every process of the node (its tree, and whatever runs in its namespace),
        again for any started meanwhile."""
        done: set[int] = set()
        while True:
            mine = {*process_tree(self.procs[node].pid), *self.net.pids(node)}
            todo = [p for p in mine if p not in done]
            if not todo:
                return
            for pid in todo:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            done.update(todo)

    def kill(self, node: int) -> None:
        self.signal_tree(node, signal.SIGKILL)
        self.procs[node].wait(timeout=60)

    def steps(self) -> list[Step]:
        path = self.folder / "steps.jsonl"
        text = path.read_text() if path.exists() else ""
        return checks.parse_steps(text[:text.rfind("\n") + 1].splitlines())

    def resolve(self, fault: Fault, taken: set[int]) -> int | None:
        """The node ``fault`` strikes now (None: no node is free for it). The endpoint's node
        is never lost for good before a replace, nor at the same moment: a node started again
        with the same command finds the job through the endpoint, which then has no one (as
        under torchrun)."""
        free = [n for n in self.net.nodes if n not in self.gone | self.busy | taken]
        replace_later = any(f.kind == "replace" and f.at >= fault.at and f is not fault
                            for f in self.schedule.faults)
        if fault.kind in PERMANENT and replace_later:
            free = [n for n in free if n != 1]
        steps = self.steps()
        server = max(steps, key=lambda s: s.mono).node if steps else 1
        if fault.target == "server" and server in free:
            return server
        others = [n for n in free if n != server]
        return others[fault.pick % len(others)] if others else None

    def begin(self, fault: Fault, node: int) -> None:
        if fault.kind in ("kill", "replace"):
            self.kill(node)
        elif fault.kind == "freeze":
            self.signal_tree(node, signal.SIGSTOP)
        elif fault.kind == "cut":
            self.net.cut(node)
        else:  # stuck
            (self.folder / f"stuck.{node}").write_text("")
        if fault.kind in ("kill", "stuck"):
            self.gone.add(node)
        else:
            self.busy.add(node)

    def finish(self, fault: Fault, node: int) -> None:
        if fault.kind == "freeze":
            self.signal_tree(node, signal.SIGCONT)
        elif fault.kind == "cut":
            self.net.heal(node)
        elif fault.kind == "replace":
            self.start(node)
        self.busy.discard(node)

    def wait_world(self, size: int, after: float, steps: int, timeout: float) -> bool:
        """Wait for ``steps`` steps of a world of ``size`` that began after ``after``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            logged = self.steps()
            began = {w.rank0: w.first.mono for w in checks.worlds(logged)}
            fresh = [s for s in logged if s.world >= size and began[s.rank0] > after]
            if len(fresh) >= steps:
                return True
            time.sleep(POLL)
        return False


def _play(job: Job, t0: float) -> tuple[list[Happened], list[str]]:
    """Play the schedule from ``t0``: each fault's start, then its end, at their times."""
    actions = sorted([(f.at, 0, i) for i, f in enumerate(job.schedule.faults)] +
                     [(f.end, 1, i) for i, f in enumerate(job.schedule.faults)])
    struck: dict[int, tuple[int, float]] = {}
    happened: list[Happened] = []
    skipped: list[str] = []
    for at, is_end, index in actions:
        fault = job.schedule.faults[index]
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        if not is_end:
            node = job.resolve(fault, {n for n, _ in struck.values()})
            if node is None:
                skipped.append(fault.describe())
                continue
            struck[index] = (node, time.monotonic())
            job.begin(fault, node)
        elif index in struck:
            node, began = struck.pop(index)
            job.finish(fault, node)
            happened.append(Happened(fault.kind, node, began, time.monotonic()))
    return happened, skipped


def _end(job: Job) -> tuple[dict[int, int | None], dict[int, str]]:
    """Ask the job to stop; each node's exit code (None: killed at the timeout) and what was
    still running in the namespaces once they ended (pid: command line)."""
    (job.folder / "stop").write_text("")
    deadline = time.monotonic() + END_TIMEOUT
    codes: dict[int, int | None] = {}
    for node, proc in job.procs.items():
        try:
            codes[node] = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            codes[node] = None
            job.kill(node)
    left: dict[int, str] = {}
    for pid in wait_gone(job.net.pids(), timeout=10):
        with contextlib.suppress(OSError):
            left[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return codes, left


def run(schedule: Schedule, folder: Path) -> Outcome:
    """Run ``schedule`` in fresh namespaces; what it left (see the module docstring). The
    ``folder`` is emptied first: a run's files (its steps, its stop mark) must be its own."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    with Net(schedule.nodes) as net:
        job = Job(net, folder, schedule)
        try:
            for node in net.nodes:
                job.start(node)
            if not job.wait_world(schedule.nodes, 0.0, 1, START_TIMEOUT):
                raise AssertionError(f"no world of {schedule.nodes} nodes within "
                                     f"{START_TIMEOUT:g} s; see {folder}")
            t0 = time.monotonic()
            happened, skipped = _play(job, t0)
            last = max((h.start for h in happened), default=t0)
            job.wait_world(max(schedule.min_nodes, schedule.final_nodes), last, SETTLE_STEPS,
                           max(checks.BOUNDS.values()) + 30)
            codes, left = _end(job)
        finally:
            for node, proc in job.procs.items():
                if proc.poll() is None:
                    job.kill(node)
    with (folder / "faults.jsonl").open("w") as out:
        for fault in happened:
            out.write(json.dumps(fault.__dict__) + "\n")
    return Outcome(schedule, folder, job.steps(), happened, codes, set(net.nodes) - job.gone,
                   left, skipped)
