"""One world at every moment (:func:`unirank.supervisor.rdzv.rounds.has_quorum`), with real
processes: two ``unirank run`` of one elastic 1:2 job on this host (the same command twice, as
torchrun's agents), one node's whole process tree frozen (SIGSTOP: a hung machine, its
connections open and silent) until the job has moved on, then resumed. Before the quorum, a
resumed node that did not serve the rendezvous served one of its own and trained a second
copy of the job beside the first.

Each world's rank 0 resumes from a checkpoint file (the step it reached) and logs every step
with its world's identity (its store's address and its node's restart) and size: the test
asserts that no two worlds' steps interleave in time and that the steps strictly increase.

Environment variables read: the caller's environment, from which launcher variables are removed
(see ``tests/_procs.py``).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _procs import Runner, free_port, process_tree

pytestmark = pytest.mark.integration

TIMEOUT = 120.0
NO_OMP = ("OMP_NUM_THREADS",)
STEPS = 60

# A trainer that resumes from its checkpoint: rank 0 logs "TIME WORLD_ID WORLD STEP" per step
# (appended: both nodes write one file) and tells the test each step's world size on the FIFO
# (the test holds it open for reading: a write never blocks).
TRAIN = """
import os, sys, time
import torch
import torch.distributed as dist

total, folder = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ident = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}/" \\
        f"{os.environ['TORCHELASTIC_RESTART_COUNT']}"
ckpt = os.path.join(folder, "ckpt")
step = torch.tensor([int(open(ckpt).read()) if rank == 0 and os.path.exists(ckpt) else -1])
dist.broadcast(step, 0)
step = int(step.item()) + 1
while step < total:
    t = torch.ones(1)
    dist.all_reduce(t)
    if rank == 0:
        with open(ckpt + ".new", "w") as out:
            out.write(str(step))
        os.replace(ckpt + ".new", ckpt)
        with open(os.path.join(folder, "steps.log"), "a") as log:
            log.write(f"{time.time_ns()} {ident} {world} {step}\\n")
        with open(os.path.join(folder, "steps.fifo"), "w") as fifo:
            fifo.write(f"{world}\\n")
    step += 1
    time.sleep(0.1)
dist.destroy_process_group()
"""


class Job:
    """One elastic job, ``--nnodes 1:2 --nproc-per-node 1 --max-restarts 5``, its nodes started
    with the same command, their output in files of the test's folder."""

    def __init__(self, runner: Runner, folder: Path) -> None:
        (folder / "train.py").write_text(TRAIN)
        self.folder, self.runner = folder, runner
        os.mkfifo(folder / "steps.fifo")
        self.reader = os.open(folder / "steps.fifo", os.O_RDONLY | os.O_NONBLOCK)
        self.keep = os.open(folder / "steps.fifo", os.O_WRONLY)  # no EOF between writers
        self.buffer = b""
        self.port = free_port()
        self.args = ["--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "5",
                     "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.port}",
                     "train.py", str(STEPS), str(folder)]
        self.procs: list[subprocess.Popen[Any]] = []

    def node(self) -> subprocess.Popen[Any]:
        index = len(self.procs)
        with open(self.folder / f"out{index}", "wb") as out, \
                open(self.folder / f"err{index}", "wb") as err:
            proc = self.runner.start(self.args, drop=NO_OMP, stdout=out.fileno(),
                                     stderr=err.fileno())
        self.procs.append(proc)
        return proc

    def step_of_world(self, world: int) -> None:
        """Until rank 0 of a world of ``world`` ran a step (at most :data:`TIMEOUT` s)."""
        while True:
            lines = self.buffer.split(b"\n")
            self.buffer = lines[-1]
            if any(line == str(world).encode() for line in lines[:-1]):
                return
            ready, _, _ = select.select([self.reader], [], [], TIMEOUT)
            assert ready, f"no step of a world of {world} within {TIMEOUT:g} s\n{self.said()}"
            self.buffer += os.read(self.reader, 65536)

    def said(self, text: str = "", index: int = 0) -> str:
        """Every node's stderr; with ``text``: wait until node ``index`` said it first
        (polling its file: the condition, not a time, is what is waited for)."""
        deadline = time.monotonic() + TIMEOUT
        path = self.folder / f"err{index}"
        while text and text not in path.read_text(errors="replace"):
            assert time.monotonic() < deadline and self.procs[index].poll() is None, \
                f"node {index} never said {text!r}\n{self.said()}"
            time.sleep(0.05)
        return "\n".join(f"--- node {i}:\n" + (self.folder / f"err{i}").read_text(
            errors="replace") for i in range(len(self.procs)))

    def end(self) -> list[int]:
        codes = [proc.wait(timeout=TIMEOUT) for proc in self.procs]
        os.close(self.reader)
        os.close(self.keep)
        return codes


def _listening(port: int, proc: subprocess.Popen[Any]) -> None:
    """Until the endpoint accepts connections (the first node serves it)."""
    import socket

    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)  # polling a port, not synchronising on time
    raise AssertionError("the first node's endpoint never listened")


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def check_one_world(log: str) -> list[tuple[str, int, list[int]]]:
    """The worlds of ``log`` (lines ``TIME WORLD_ID WORLD STEP``) in the order they trained:
    (identity, size, steps); fails where two worlds' steps interleave in time or the steps do
    not strictly increase."""
    rows = sorted((int(t), ident, int(world), int(step))
                  for t, ident, world, step in (line.split() for line in log.splitlines()))
    steps = [step for _t, _ident, _world, step in rows]
    assert steps == sorted(set(steps)), f"steps not strictly increasing:\n{log}"
    worlds: list[tuple[str, int, list[int]]] = []
    for _t, ident, world, step in rows:
        if worlds and worlds[-1][0] == ident:
            worlds[-1][2].append(step)
            continue
        assert ident not in [w[0] for w in worlds], f"world {ident} trained twice:\n{log}"
        worlds.append((ident, world, [step]))
    return worlds


def test_the_check_sees_two_worlds_side_by_side() -> None:
    """The check itself: two copies training at once (the split this file guards against)
    interleave in time and repeat steps; one world after another passes."""
    split = "1 a/0 1 5\n2 b/0 1 5\n3 a/0 1 6\n4 b/0 1 6\n"
    with pytest.raises(AssertionError):
        check_one_world(split)
    with pytest.raises(AssertionError):  # interleaved, even with increasing steps
        check_one_world("1 a/0 2 5\n2 b/0 1 6\n3 a/0 2 7\n")
    assert check_one_world("1 a/0 2 5\n2 a/0 2 6\n3 b/1 1 7\n4 a/1 2 8\n") == [
        ("a/0", 2, [5, 6]), ("b/1", 1, [7]), ("a/1", 2, [8])]


@pytest.mark.parametrize("frozen", ["other", "serving"])
def test_a_frozen_node_resumed_never_trains_a_second_world(runner: Runner, tmp_path: Path,
                                                           frozen: str) -> None:
    """Either node's whole tree frozen until the job moved on, then resumed: one world at
    every moment, the steps strictly increasing, both nodes end 0. The other node frozen: the
    serving node goes on alone (the tie-break: it is the first of the round), and the resumed
    node joins it. The serving node frozen: the other waits for it (a two-node job cannot
    tell a frozen first node from a dead one), and both go on once it resumes."""
    job = Job(runner, tmp_path)
    serving = job.node()
    _listening(job.port, serving)
    other = job.node()
    job.step_of_world(2)
    index, proc = (1, other) if frozen == "other" else (0, serving)
    tree = process_tree(proc.pid)
    try:
        _signal(tree, signal.SIGSTOP)
        if frozen == "other":
            job.step_of_world(1)  # the serving node trains alone
        else:
            job.said("unirank run: store moved to node ", index=1)  # the other gave up on it
    finally:
        _signal(tree, signal.SIGCONT)
    codes = job.end()
    said = job.said()
    assert codes == [0, 0], said
    assert "unirank run: an elastic job of 2 nodes cannot tell a stalled or cut-off first " \
        "node from a lost one" in said, said
    worlds = check_one_world((tmp_path / "steps.log").read_text())
    assert worlds[-1][2][-1] == STEPS - 1, worlds
    if frozen == "other":
        assert [size for _ident, size, _steps in worlds][:2] == [2, 1], worlds
