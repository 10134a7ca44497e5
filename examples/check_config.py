"""Report the configuration: torch, CUDA, Slurm, the detected launcher, NCCL/GLOO/TORCH settings.

Prints the classic lines (``torch version : X``, ``torch git version : X``, the CUDA devices or
``no cuda available``, and inside a Slurm job SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS,
SLURM_JOB_NODELIST and the host names), then the launcher unirank detected with every field of
its DistEnv, and every NCCL_*/GLOO_*/TORCH_* variable (secrets masked). ``--json`` for machines.
The same report as ``unirank check``.

Run it unchanged with::

    python examples/check_config.py
    torchrun --nproc_per_node 2 examples/check_config.py
    srun --nodes=1 --ntasks=1 python examples/check_config.py
    sbatch --nodes=1 --ntasks=1 --wrap "srun python examples/check_config.py"
    mpirun -np 2 python examples/check_config.py
"""

from __future__ import annotations

import argparse
import sys

from unirank.cli import check

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    check.add_arguments(parser)
    sys.exit(check.main(parser.parse_args()))
