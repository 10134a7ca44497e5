"""Benchmark worker: per-call cost of ``ur.all_reduce`` against ``dist.all_reduce`` (4 bytes).

Both are timed in interleaved rounds in the same processes; rank 0 prints one JSON line with the
median per-call time of each.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

import unirank as ur

CALLS = 2000
ROUNDS = 9


def timed(fn: object, tensor: torch.Tensor) -> float:
    call = fn  # type: ignore[assignment]
    dist.barrier()
    start = time.perf_counter()
    for _ in range(CALLS):
        call(tensor)  # type: ignore[operator]
    return (time.perf_counter() - start) / CALLS


def main() -> None:
    ur.init(backend="gloo")
    tensor = torch.ones(1)
    for _ in range(200):  # warm up both paths
        dist.all_reduce(tensor)
        ur.all_reduce(tensor)
    raw, ours = [], []
    for _ in range(ROUNDS):
        raw.append(timed(dist.all_reduce, tensor))
        ours.append(timed(ur.all_reduce, tensor))
    if dist.get_rank() == 0:
        print(json.dumps({"dist": statistics.median(raw), "unirank": statistics.median(ours)}))
        sys.stdout.flush()
    ur.finalize()


if __name__ == "__main__":
    main()
