"""README's quick start: one function, any launcher.

    python examples/quickstart.py                      # serial: world=1 sum=1.0
    unirank run -n 2 examples/quickstart.py            # world=2 sum=2.0
    torchrun --nproc_per_node 2 examples/quickstart.py
    srun -N2 --ntasks-per-node=2 python examples/quickstart.py
    mpirun -np 2 python examples/quickstart.py
"""

import unirank as ur


def main() -> None:
    x = ur.all_reduce(1.0)  # world size; works serial too
    ur.print0(f"world={ur.get_world_size()} sum={x} backend={ur.backend()} device={ur.device()}")


if __name__ == "__main__":
    ur.init()  # detects torchrun, srun, mpirun, ... or runs serial (a group of one)
    main()
    ur.finalize()
