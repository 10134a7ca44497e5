"""One "node" of a multi-node spawn: Parallel(nproc_per_node=2, nnodes=2, node_rank=R, ...).

Usage: python multinode_job.py NODE_RANK MASTER_PORT
Each worker prints ``RESULT rank world node_rank local_rank sum``.
"""

from __future__ import annotations

import sys

import torch

import unirank as ur


def body(local_rank: int) -> None:
    total = ur.all_reduce(torch.ones(1)).item()
    sys.stdout.write(f"RESULT {ur.get_rank()} {ur.get_world_size()} {ur.get_node_rank()} "
                     f"{local_rank} {total:g}\n")  # one write: lines stay whole
    sys.stdout.flush()


if __name__ == "__main__":
    node_rank, port = int(sys.argv[1]), int(sys.argv[2])
    with ur.Parallel(backend="gloo", nproc_per_node=2, nnodes=2, node_rank=node_rank,
                     master_addr="127.0.0.1", master_port=port) as parallel:
        parallel.run(body)
