"""A training loop that saves when asked to stop, for the PID 1 tests (tests/integration/
test_pid1.py): every rank prints ``READY rank`` once its group is up, steps until
``ur.stop_requested()``, writes ``ckpt.<rank>`` in OUT and ends 0.

With ``--orphan``, rank 0 first leaves an orphan: a child that forks a grandchild and exits at
once, so the grandchild (which exits at once too) is re-parented to PID 1. Rank 0 then waits (at
most 30 s) for the grandchild's /proc entry to go, i.e. for PID 1 to reap it, and prints
``ORPHAN reaped`` or ``ORPHAN zombie``.

With ``--stop-on-int`` SIGINT (a terminal's Ctrl-C) asks to stop as SIGTERM does; with
``--slow-save`` writing the checkpoint takes a second (within the grace period, but not a
second stop signal's immediate SIGKILL).

Usage: pid1_job.py OUT [--orphan] [--stop-on-int] [--slow-save]
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import unirank as ur


def leave_orphan(out: Path) -> int:
    """Fork a child that forks a grandchild and exits; the grandchild's pid."""
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_fd)
        grandchild = os.fork()
        if grandchild == 0:
            os._exit(0)
        os.write(write_fd, str(grandchild).encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        grandchild = int(pipe.read())
    os.waitpid(child, 0)
    return grandchild


def reaped(pid: int, timeout: float = 30.0) -> bool:
    """True once ``pid`` has no /proc entry (it ended and was reaped), False after ``timeout``
    (a zombie keeps its entry). Nothing tells another process of a reaping: this polls."""
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def main() -> int:
    out = Path(sys.argv[1])
    ur.init()
    rank = ur.get_rank()
    if "--orphan" in sys.argv and rank == 0:
        orphan = leave_orphan(out)
        print(f"ORPHAN {'reaped' if reaped(orphan) else 'zombie'}", flush=True)
    # before READY: a stop signal may come right after it, before the first step
    if "--stop-on-int" in sys.argv:  # a terminal's Ctrl-C asks to stop too
        ur.watch_stop_signals((signal.SIGINT, signal.SIGTERM))
    else:
        ur.watch_stop_signals()
    ur.barrier()
    print(f"READY {rank}", flush=True)
    step = 0
    while not ur.stop_requested():
        step += 1
        time.sleep(0.02)  # a training step
    if "--slow-save" in sys.argv:
        time.sleep(1.0)  # a checkpoint that takes a while to write (not a synchronisation)
    (out / f"ckpt.{rank}").write_text(str(step))
    print(f"SAVED {rank} {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
