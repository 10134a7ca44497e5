"""``unirank reduce``: all_reduce a tensor of ones; every rank prints the sum.

Each rank prints ``[http://ADDR:PORT] [NODE:BACKEND] process R/W has data tensor([W.])`` (on CUDA
the tensor shows its device), in rank order. Options as ``unirank hello``.
No torch at import.
"""

from __future__ import annotations

import argparse

from unirank.cli.hello import add_launch_arguments, launch, master_url


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``unirank reduce`` (the same as ``unirank hello``'s)."""
    add_launch_arguments(parser)


def reduce_ones(local_rank: int) -> None:
    """Worker body: all_reduce ``torch.ones(1)`` on this rank's device and print it."""
    import torch

    import unirank as ur
    from unirank.runtime.helpers import print_in_rank_order

    data = torch.ones(1, device=ur.device())
    ur.all_reduce(data)
    print_in_rank_order(
        f"[{master_url()}] [{ur.hostname()}:{ur.backend()}] "
        f"process {ur.get_rank()}/{ur.get_world_size()} has data {data}"
    )


def main(args: argparse.Namespace) -> int:
    """Reduce on every rank. Reads: see :func:`unirank.cli.hello.launch`."""
    return launch("reduce", args, reduce_ones)
