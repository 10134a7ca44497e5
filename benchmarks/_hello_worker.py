"""Benchmark worker: a plain torchrun-style script (gloo init, one all_reduce, exit).

With ``UNIRANK_BENCH_TIMES=<dir>`` it writes ``<dir>/<rank>.json`` with wall-clock times of the
start and end of ``init_process_group``, for the init-latency measurement.
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    start = time.time()
    dist.init_process_group("gloo")
    end = time.time()
    t = torch.ones(1)
    dist.all_reduce(t)
    assert int(t.item()) == dist.get_world_size()
    out = os.environ.get("UNIRANK_BENCH_TIMES")
    if out:
        with open(os.path.join(out, f"{dist.get_rank()}.json"), "w") as fh:
            json.dump({"start": start, "end": end}, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
