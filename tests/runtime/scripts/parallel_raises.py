"""``Parallel(nproc_per_node=2)`` whose function raises ``ValueError`` on rank 1 (not caught)."""

from __future__ import annotations

import unirank as ur


def work(local_rank: int) -> None:
    if local_rank == 1:
        raise ValueError("bad value on rank 1")


if __name__ == "__main__":
    with ur.Parallel(backend="gloo", nproc_per_node=2) as parallel:
        parallel.run(work)
