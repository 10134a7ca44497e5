"""Benchmark worker: what the hang watcher's 20 looks a second cost a training loop, A/B in one
process. ``python benchmarks/_look_ab_worker.py PAIRS`` trains ``examples/train.py``'s model (DDP,
a one-rank gloo group) in alternating 0.5 s windows, a thread looking at the flight recorder's
status every :data:`unirank.hang.waits.SAMPLE_PERIOD` (as the watcher does) in one window of each
pair and idle in the other (the order alternates), so that the machine's load hits both alike.
Prints ``LOOK_AB median q1 q3 pairs``: steps/s with the looks / without, per pair.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "64")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "0")

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from train import SmallCNN

from unirank.hang.waits import SAMPLE_PERIOD, WaitMeter, recorder_status

WINDOW_S = 0.5


def main(pairs: int) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    model = DistributedDataParallel(SmallCNN())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data, target = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    criterion = nn.CrossEntropyLoss()
    looking, stop = threading.Event(), threading.Event()
    meter = WaitMeter()

    def look() -> None:
        while not stop.is_set():
            if looking.is_set():
                meter.look(time.monotonic(), recorder_status())
            time.sleep(SAMPLE_PERIOD)

    def steps_per_s() -> float:
        steps, end = 0, time.perf_counter() + WINDOW_S
        while time.perf_counter() < end:
            optimizer.zero_grad()
            criterion(model(data), target).backward()
            optimizer.step()
            steps += 1
        return steps / WINDOW_S

    threading.Thread(target=look, daemon=True).start()
    steps_per_s()  # warm-up
    ratios = []
    for pair in range(pairs):
        rates = {}
        for on in ((False, True) if pair % 2 == 0 else (True, False)):
            (looking.set if on else looking.clear)()
            rates[on] = steps_per_s()
        ratios.append(rates[True] / rates[False])
    stop.set()
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    print(f"LOOK_AB {median:.4f} {q1:.4f} {q3:.4f} {pairs} {meter.samples}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 40)
