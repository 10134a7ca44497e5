"""Two workers that print ``READY pid`` and then wait forever; the test SIGKILLs this parent."""

from __future__ import annotations

import os
import sys
import threading

import unirank as ur


def body(local_rank: int) -> None:
    sys.stdout.write(f"READY {os.getpid()}\n")
    sys.stdout.flush()
    threading.Event().wait()


if __name__ == "__main__":
    print(f"PARENT {os.getpid()}", flush=True)
    with ur.Parallel(backend="gloo", nproc_per_node=2) as parallel:
        parallel.run(body)
