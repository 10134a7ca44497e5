"""Benchmark worker for the memory measurement: gloo init, a barrier, then hold still.

After the barrier it connects to the Unix socket ``UNIRANK_BENCH_SOCKET`` names, sends its
pid and waits, allocating nothing, until the harness closes the connection (or 300 s pass),
so that the harness can read every worker's ``/proc/PID/smaps_rollup`` while all are alive.

Reads: UNIRANK_BENCH_SOCKET (the harness's socket path).
"""

from __future__ import annotations

import os
import socket

import torch.distributed as dist


def hold(path: str) -> None:
    """Tell the harness this process's pid, then wait until it closes the connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(300)
        sock.connect(path)
        sock.sendall(f"{os.getpid()}\n".encode())
        while sock.recv(64):
            pass


def main() -> None:
    dist.init_process_group("gloo")
    dist.barrier()
    hold(os.environ["UNIRANK_BENCH_SOCKET"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
