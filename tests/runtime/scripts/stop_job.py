"""Under ``unirank run -n 2``: rank ``--signal-rank`` sends itself SIGUSR2 after step
``--signal-step``; every rank prints the step at which ``ur.stop_requested(every=K)`` agreed, and
with ``--time-calls N`` the mean cost of N calls that agree on "go on"."""

from __future__ import annotations

import argparse
import os
import signal
import time

import unirank as ur


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--signal-rank", type=int, default=1)
    parser.add_argument("--signal-step", type=int, default=5)
    parser.add_argument("--time-calls", type=int, default=0)
    args = parser.parse_args()
    ur.init("gloo")
    rank = ur.get_rank()
    watched = ur.watch_stop_signals()
    print(f"rank {rank} watches {sorted(signal.Signals(s).name for s in watched)}", flush=True)
    if args.time_calls:
        ur.barrier()
        start = time.perf_counter()
        for _ in range(args.time_calls):
            assert not ur.stop_requested(every=args.every)
        spent = time.perf_counter() - start
        print(f"rank {rank} stop_requested(every={args.every}): "
              f"{spent / args.time_calls * 1e6:.1f} us per call", flush=True)
    ur.unwatch_stop_signals()  # forgets the calls counted so far: steps count from 0 below
    step = 0
    while step < 1000:
        step += 1
        if rank == args.signal_rank and step == args.signal_step:
            os.kill(os.getpid(), signal.SIGUSR2)
        if ur.stop_requested(every=args.every):
            break
    print(f"rank {rank} stopped after step {step}", flush=True)
    ur.unwatch_stop_signals()
    print(f"rank {rank} handler restored: {signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL}",
          flush=True)
    ur.finalize()


if __name__ == "__main__":
    main()
