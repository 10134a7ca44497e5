"""The fault harness's training program: ``train.py SHARED`` (one rank per node).

Each step every rank all-reduces ``[1, stop]`` (``stop`` is rank 0's: 1 once the file
``SHARED/stop`` exists); then rank 0 saves the step in ``SHARED/ckpt.json`` (written aside, then
renamed) and appends one JSON line to ``SHARED/steps.jsonl``: ``step``, ``world`` (the world
size), ``sum`` (the all-reduce's first element: the ranks that took part), ``round``
(``ur.elastic_state().restart_count``), ``node`` (``FAULT_NODE``), ``pid`` (rank 0's: one
world, one rank 0 process), ``mono`` and ``real`` (``time.monotonic()`` and ``time.time()``
right after the all-reduce; every namespace shares the machine's clocks), ``stop`` (whether
this step saw the stop: the last one). A restarted world
resumes after the step in the checkpoint (rank 0 reads it and broadcasts it). The ranks end
after the step in which they saw ``stop``.

A stuck rank: when ``SHARED/stuck.<FAULT_NODE>`` exists at a step's start, the rank renames it
(``.taken``) and sleeps in user code for good, as a rank stuck in user code does.

Environment variables read: ``FAULT_NODE`` (the harness's number of this node), and what
``ur.elastic_state()`` and ``torch.distributed``'s ``env://`` read.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import unirank as ur

STEP_PAUSE = 0.1


def _resume_step(shared: Path, rank: int) -> int:
    """The first step of this world: after the checkpoint's (rank 0's view, broadcast)."""
    start = torch.zeros(1, dtype=torch.int64)
    if rank == 0:
        ckpt = shared / "ckpt.json"
        if ckpt.exists():
            start[0] = int(json.loads(ckpt.read_text())["step"]) + 1
    dist.broadcast(start, 0)
    return int(start.item())


def _record(shared: Path, line: dict[str, object]) -> None:
    aside = shared / f"ckpt.{os.getpid()}.tmp"
    aside.write_text(json.dumps({"step": line["step"]}))
    os.replace(aside, shared / "ckpt.json")
    fd = os.open(shared / "steps.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def main(shared: Path) -> None:
    node = os.environ["FAULT_NODE"]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restarts = ur.elastic_state().restart_count
    step = _resume_step(shared, rank)
    while True:
        stuck = shared / f"stuck.{node}"
        if stuck.exists():
            stuck.rename(shared / f"stuck.{node}.taken")
            time.sleep(1e9)
        stop = 1.0 if rank == 0 and (shared / "stop").exists() else 0.0
        both = torch.tensor([1.0, stop])
        dist.all_reduce(both)
        mono, real = time.monotonic(), time.time()
        if rank == 0:
            _record(shared, {"step": step, "world": world, "sum": int(both[0].item()),
                             "round": restarts, "node": int(node), "pid": os.getpid(),
                             "mono": mono, "real": real, "stop": both[1].item() > 0})
        if both[1].item() > 0:
            break
        step += 1
        time.sleep(STEP_PAUSE)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
