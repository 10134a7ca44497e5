"""A loop that keeps its state with ``ur.save_state`` at every step and, asked to stop, ends
for a requeue without saving anything more: ``unirank run`` copies the newest step its
memory holds to the folder as it ends. The Slurm requeue test's program
(tests/integration/test_preemption.py).

``python state_requeue.py FOLDER STEPS HOLD``: the first run (nothing restored) holds after
saving step HOLD until the stop (at most two minutes); every run prints, on rank 0, the step
it restored and the state's value (step + 1 where the state is that step's), each step saved,
and the value at the end.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist

import unirank as ur


def main() -> None:
    folder, steps, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ur.init()
    ur.watch_stop_signals()
    state = {"w": torch.zeros(64), "step": -1}
    restored = ur.load_state(state, folder=folder)
    ur.print0(f"restored step {restored}: w={state['w'][0].item()}", flush=True)
    for step in range(0 if restored is None else restored + 1, steps):
        dist.all_reduce(torch.ones(1))
        state["w"].add_(1.0)
        state["step"] = step
        ur.save_state(step, state, folder=folder)
        ur.print0(f"saved step {step}", flush=True)
        if restored is None and step == hold:
            ur.print0("HOLDING", flush=True)
            deadline = time.monotonic() + 120.0
            while not ur.stop_requested() and time.monotonic() < deadline:
                time.sleep(0.05)
        if ur.stop_requested():
            ur.print0(f"stopped after step {step}", flush=True)
            ur.exit_for_requeue()
    ur.print0(f"done: w={state['w'][0].item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
