"""Two gloo workers; local rank 1 fails after both printed ``PID``, rank 0 blocks in a barrier.

Usage: python failing_job.py exit|raise
The parent prints ``FAILED local_rank rank exitcode`` and the error, then exits 7.
"""

from __future__ import annotations

import os
import sys

import unirank as ur
from unirank.runtime import WorkerFailedError


def body(local_rank: int, how: str) -> None:
    sys.stdout.write(f"PID {local_rank} {os.getpid()}\n")  # one write: lines stay whole
    sys.stdout.flush()
    ur.barrier()
    if local_rank == 1:
        if how == "exit":
            sys.exit(3)
        raise ValueError("boom from rank 1")
    ur.barrier()  # never completes: rank 1 is gone


if __name__ == "__main__":
    try:
        with ur.Parallel(backend="gloo", nproc_per_node=2) as parallel:
            parallel.run(body, sys.argv[1])
    except WorkerFailedError as exc:
        print(f"FAILED {exc.local_rank} {exc.rank} {exc.exitcode}", flush=True)
        print(f"ERROR {exc}", flush=True)
        sys.exit(7)
