"""Run under torchrun: the script creates the process group itself, then uses unirank.

Each rank prints ``RESULT rank world backend sum initialized_after``.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import unirank as ur

SEEN: list[str] = []


def body(local_rank: int) -> None:
    total = ur.all_reduce(torch.ones(1)).item()
    SEEN.extend([str(ur.get_rank()), str(ur.get_world_size()), str(ur.backend()), f"{total:g}"])


if __name__ == "__main__":
    dist.init_process_group("gloo")
    with ur.Parallel() as parallel:
        parallel.run(body)
    SEEN.append(str(dist.is_initialized()))
    sys.stdout.write("RESULT " + " ".join(SEEN) + "\n")  # one write: lines stay whole
    sys.stdout.flush()
    dist.destroy_process_group()
