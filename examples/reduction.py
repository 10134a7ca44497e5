"""all_reduce a tensor of ones: every rank ends up with the world size.

Each rank prints ``[http://ADDR:PORT] [NODE:BACKEND] process RANK/WORLD has data tensor([W.])``
(with ``device='cuda:i'`` on GPUs).

Run it unchanged with::

    python examples/reduction.py                                       # serial: tensor([1.])
    python examples/reduction.py --nproc-per-node 4                    # spawns 4 local workers
    torchrun --nproc_per_node 2 examples/reduction.py
    python -m torch.distributed.run --nproc_per_node 2 examples/reduction.py
    srun -N2 --ntasks-per-node=2 python examples/reduction.py
    srun -N2 --ntasks-per-node=1 python examples/reduction.py --nproc-per-node 2
    sbatch --nodes=2 --ntasks-per-node=2 --wrap "srun python examples/reduction.py"
    mpirun -np 4 -x MASTER_ADDR=$(hostname) -x MASTER_PORT=29500 python examples/reduction.py
    unirank run --nproc-per-node 2 examples/reduction.py
"""

from __future__ import annotations

import argparse
import sys

import torch

import unirank as ur
from unirank.cli.hello import add_launch_arguments


def reduce_ones(local_rank: int) -> None:
    """Sum ``torch.ones(1)`` over every rank; print the result on each rank, in rank order."""
    data = torch.ones(1, device=ur.device())
    ur.all_reduce(data)
    env = ur.dist_env()
    addr = f"http://{env.master_addr}:{env.master_port}"
    where = f"[{ur.hostname()}:{ur.backend()}]"
    rank, world = ur.get_rank(), ur.get_world_size()
    for turn in range(world):
        if turn == rank:
            # one write for the line and its end: mpirun forwards each rank's output in the
            # chunks written, and an unbuffered print writes the two apart
            sys.stdout.write(f"[{addr}] {where} process {rank}/{world} has data {data}\n")
            sys.stdout.flush()
        ur.barrier()


def parse_args() -> argparse.Namespace:
    """``--backend`` (auto), ``-n/--nproc-per-node``, ``--init-timeout``, as ``unirank hello``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_launch_arguments(parser)
    return parser.parse_args()


if __name__ == "__main__":
    args = parse_args()
    try:
        with ur.Parallel(
            backend=args.backend, nproc_per_node=args.nproc_per_node,
            init_timeout=args.init_timeout,
        ) as parallel:
            parallel.run(reduce_ones)
    except ur.ConfigError as exc:  # a launch mistake: one line that says what to do
        sys.exit(f"reduction.py: error: {exc}")
