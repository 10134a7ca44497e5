"""One world at every moment, as the tests see it: an elastic job whose rank 0 resumes from a
checkpoint file and logs every step with its world's identity and size (:data:`TRAIN`), its
nodes started by :class:`Job`, and :func:`check_one_world` over the log. Used by
tests/cli/test_elastic_oneworld.py (nodes on this host) and
tests/integration/test_oneworld_netns.py (nodes in network namespaces).

Environment variables read: none (the nodes get the runner's environment).
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _procs import Runner, free_port

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
    """One elastic job, ``--nnodes NNODES --nproc-per-node 1 --max-restarts 5``, its nodes
    started with the same command (and ``--local-addr`` where given), their output in files of
    the test's folder."""

    def __init__(self, runner: Runner, folder: Path, nnodes: str = "1:2",
                 endpoint: str = "127.0.0.1") -> None:
        (folder / "train.py").write_text(TRAIN)
        self.folder, self.runner = folder, runner
        os.mkfifo(folder / "steps.fifo")
        self.reader = os.open(folder / "steps.fifo", os.O_RDONLY | os.O_NONBLOCK)
        self.keep = os.open(folder / "steps.fifo", os.O_WRONLY)  # no EOF between writers
        self.buffer = b""
        self.port = free_port()
        self.endpoint = endpoint
        self.args = ["--nnodes", nnodes, "--nproc-per-node", "1", "--max-restarts", "5",
                     "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{endpoint}:{self.port}"]
        self.target = ["train.py", str(STEPS), str(folder)]
        self.procs: list[subprocess.Popen[Any]] = []

    def node(self, prefix: Sequence[str] = (), addr: str | None = None,
             env: dict[str, str] | None = None) -> subprocess.Popen[Any]:
        """Start a node (after ``prefix``: in a network namespace), at ``addr``."""
        index = len(self.procs)
        local = ["--local-addr", addr] if addr else []
        with open(self.folder / f"out{index}", "wb") as out, \
                open(self.folder / f"err{index}", "wb") as err:
            command = Runner.command([*self.args, *local, *self.target], prefix)
            proc: subprocess.Popen[Any] = self.runner.start(
                drop=NO_OMP, stdout=out.fileno(), stderr=err.fileno(), command=command, env=env)
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


def listening(port: int, proc: subprocess.Popen[Any], prefix: Sequence[str] = (),
              host: str = "127.0.0.1") -> None:
    """Until the endpoint accepts connections (the first node serves it); with ``prefix``,
    as seen from a network namespace (``ss`` there)."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        if prefix:
            shown = subprocess.run([*prefix, "ss", "-ltnH", f"sport = :{port}"],
                                   capture_output=True, text=True, timeout=30).stdout
            if shown.strip():
                return
        else:
            with socket.socket() as sock:
                if sock.connect_ex((host, port)) == 0:
                    return
        time.sleep(0.05)  # polling a port, not synchronising on time
    raise AssertionError(f"the first node's endpoint never listened (exit {proc.poll()})")


def send(pids: list[int], signum: int) -> None:
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


