"""Accuracy of `unirank bench`: its all_reduce busbw against a raw torch timing loop.

    python3 benchmarks/bench_accuracy.py [--rounds 5] [--min-bytes 1M] [--max-bytes 256M]
                                         [--step-factor 4] [--iters 20] [--warmup 5]

Target: at every size, bench's busbw is within 5 % of the raw loop's: the median over the rounds
of the ratio of the two measurements taken back to back. Both run in the same 2 local gloo ranks
(`unirank run -n 2` of this file), interleaved size by size and round by round (the order
alternates), so that a change of load on a shared machine hits both alike:

* bench: `unirank.bench.worker.measure_row`, the code behind every row of `unirank bench`
  (known inputs, warmup, barrier, timed calls with per-call stamps, MAX over ranks, the check);
* raw: `dist.all_reduce` of a float32 tensor of the same bytes, `warmup` calls,
  `dist.barrier()`, `iters` calls timed with perf_counter, the slowest rank's mean,
  busbw = bytes / time * 2(n-1)/n / 1e9.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from unirank.bench.sizes import parse_size, sweep

HERE = Path(__file__).resolve()
PY = sys.executable
TARGET = 0.05


def clean_env() -> dict[str, str]:
    prefixes = ("SLURM", "OMPI", "PMI", "PMIX", "RANK", "LOCAL_", "WORLD_SIZE", "GROUP_",
                "MASTER_", "TORCHELASTIC", "UNIRANK")
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


def raw_busbw(size: int, iters: int, warmup: int) -> float:
    """The reference: a plain torch.distributed timing loop."""
    import torch
    import torch.distributed as dist

    tensor = torch.ones(size // 4)
    for _ in range(warmup):
        dist.all_reduce(tensor)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    seconds = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    n = dist.get_world_size()
    return tensor.numel() * 4 / seconds.item() / 1e9 * 2 * (n - 1) / n


def worker(options: dict[str, int]) -> None:
    """Runs on each of the 2 ranks; rank 0 prints one JSON line of every measurement."""
    import torch.distributed as dist

    import unirank as ur
    from unirank.bench.config import make_config
    from unirank.bench.worker import measure_row

    ur.init(backend="gloo")
    config = make_config(op="all_reduce", dtype="float32", min_bytes=str(options["min"]),
                         max_bytes=str(options["max"]), step_factor=str(options["factor"]),
                         iters=str(options["iters"]), warmup=str(options["warmup"]))
    runs: dict[str, dict[int, list[float]]] = {"bench": {}, "raw": {}}
    for round_ in range(options["rounds"]):
        for size in config.sizes:
            order = ("bench", "raw") if round_ % 2 == 0 else ("raw", "bench")
            for name in order:
                if name == "bench":
                    row = measure_row("all_reduce", size, config, ur.device())
                    assert row.wrong == 0, row
                    busbw = row.busbw
                else:
                    busbw = raw_busbw(size, config.iters, config.warmup)
                runs[name].setdefault(size, []).append(busbw)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(runs), flush=True)
    ur.finalize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternations (default 5)")
    parser.add_argument("--min-bytes", default="1M")
    parser.add_argument("--max-bytes", default="256M")
    parser.add_argument("--step-factor", type=int, default=4)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    options = {"min": parse_size(args.min_bytes), "max": parse_size(args.max_bytes),
               "factor": args.step_factor, "iters": args.iters, "warmup": args.warmup,
               "rounds": args.rounds}
    out = subprocess.run([PY, "-m", "unirank", "run", "-n", "2", str(HERE), "--worker",
                          json.dumps(options)], env=clean_env(), check=True, timeout=3600,
                         capture_output=True, text=True).stdout
    line = next(line for line in out.splitlines() if line.startswith("RESULT "))
    runs = {name: {int(size): values for size, values in per_size.items()}
            for name, per_size in json.loads(line[len("RESULT "):]).items()}
    print(f"all_reduce float32, 2 local gloo ranks, {args.rounds} rounds; busbw in GB/s "
          f"(median over rounds); ratio = median of bench/raw per round [min, max]")
    print(f"{'size (B)':>12}  {'bench busbw':>11}  {'raw busbw':>9}  {'ratio':>6}")
    ok = True
    pooled: list[float] = []
    for size in sweep(options["min"], options["max"], options["factor"]):
        ours, raw = runs["bench"][size], runs["raw"][size]
        ratios = [a / b for a, b in zip(ours, raw)]
        pooled += ratios
        ratio = statistics.median(ratios)
        good = abs(ratio - 1) <= TARGET
        ok = ok and good
        print(f"{size:12d}  {statistics.median(ours):11.3f}  {statistics.median(raw):9.3f}  "
              f"{ratio:6.3f}  [{min(ratios):.3f}, {max(ratios):.3f}]  {'OK' if good else 'MISS'}")
    print(f"all sizes pooled: median ratio {statistics.median(pooled):.3f} over {len(pooled)} "
          f"pairs")
    print(f"bench busbw within {TARGET:.0%} of the raw loop at every size: "
          f"{'OK' if ok else 'MISS'}")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]))
    else:
        sys.exit(main())
