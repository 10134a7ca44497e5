"""A torchrun-style worker whose global rank ``CRASH_RANK`` raises after joining; the others block.

Usage: ``python crash_rank.py CRASH_RANK MARKER`` under ``unirank run`` (or any launcher). Every
rank prints ``PID <rank> <pid> <node>``, joins the process group, then rank ``CRASH_RANK`` raises
``RuntimeError("crash marker ...")`` while the others wait in a barrier that can never complete.
``MARKER`` only makes the command line unique, so that the test can look for leftover processes
with ``pgrep -f MARKER``.
"""

from __future__ import annotations

import os
import sys

import unirank as ur


def body(local_rank: int, crash_rank: int, marker: str) -> None:
    rank = ur.get_rank()
    sys.stdout.write(f"PID {rank} {os.getpid()} {ur.hostname()}\n")
    sys.stdout.flush()
    ur.barrier()
    if rank == crash_rank:
        raise RuntimeError(f"crash marker {marker} on rank {rank}")
    ur.barrier()  # never completes: the crashing rank is gone


if __name__ == "__main__":
    crash, mark = int(sys.argv[1]), sys.argv[2]
    with ur.Parallel(backend="gloo") as parallel:
        parallel.run(body, crash, mark)
