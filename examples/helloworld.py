"""Every rank says hello, in rank order: the same script under any launcher.

Each rank prints ``[http://MASTER_ADDR:MASTER_PORT] hello from [NODE:BACKEND] process RANK/WORLD``.

Run it unchanged with::

    python examples/helloworld.py --backend gloo                       # serial: process 0/1
    python examples/helloworld.py --nproc-per-node 4                   # spawns 4 local workers
    torchrun --nproc_per_node 2 examples/helloworld.py --backend gloo
    python -m torch.distributed.run --nproc_per_node 2 examples/helloworld.py
    srun -N2 --ntasks-per-node=2 python examples/helloworld.py
    srun -N2 --ntasks-per-node=1 python examples/helloworld.py --nproc-per-node 2  # one per GPU
    sbatch --nodes=2 --ntasks-per-node=2 --wrap "srun python examples/helloworld.py"
    mpirun -np 4 -x MASTER_ADDR=$(hostname) -x MASTER_PORT=29500 python examples/helloworld.py
    unirank run --nproc-per-node 2 examples/helloworld.py

(``mpirun`` on one host needs no MASTER_ADDR; across hosts, export the first host's name.)
"""

from __future__ import annotations

import argparse
import sys

import unirank as ur
from unirank.cli.hello import add_launch_arguments


def hello(local_rank: int) -> None:
    """Print this rank's hello line on its turn, rank 0 first."""
    env = ur.dist_env()
    rank, world = ur.get_rank(), ur.get_world_size()
    for turn in range(world):
        if turn == rank:
            addr = f"http://{env.master_addr}:{env.master_port}"
            line = f"hello from [{ur.hostname()}:{ur.backend()}] process {rank}/{world}"
            print(f"[{addr}] {line}", flush=True)
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
            parallel.run(hello)
    except (ur.ConfigError, ur.InitError) as exc:  # a launch mistake or a rank that never
        sys.exit(f"helloworld.py: error: {exc}")    # joined: one line that says what to do
