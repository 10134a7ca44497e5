"""No straggler named in a clean run: the false-positive side of the straggler rule
(:mod:`unirank.hang.slowrank`), measured for real, with the settings a user starts with.

Two nodes of an elastic job on this host (the same command twice, as a user would start them:
``unirank run --nnodes 1:2 --nproc-per-node 4 --rdzv-backend c10d``, no hang or straggler
option), 8 ranks in all; each step every rank works (sleeps) 0.1 s times a factor drawn
uniformly from 0.8 to 1.2 (a step time that jitters by +-20 %, each rank its own draws), then
all-reduces one number. For ``--seconds`` (default 600: ten minutes) of training, the nodes'
consoles are searched for a straggler named (``keeps the others waiting``), an eviction, a hang
report or a restart. Prints one line per kind and ``clean: yes`` or ``clean: no``; exit code 0
where clean. There is no peer to compare with: torchrun names no straggler, ever.

    python3 benchmarks/straggler_clean.py [--seconds 600]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: what each rank runs: steps of 0.1 s +-20 % of sleep, then an all_reduce, until STOP exists
WORKER = """
import os, random, sys, time
import torch
import torch.distributed as dist

stop = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
draw = random.Random(rank)
flag, step = torch.zeros(1), 0
while not flag.item():
    time.sleep(0.1 * draw.uniform(0.8, 1.2))
    flag.fill_(float(rank == 0 and os.path.exists(stop)))
    dist.all_reduce(flag)
    step += 1
print(f"rank {rank} steps {step}", flush=True)
dist.destroy_process_group()
"""
#: what a console must not say in a clean run
FALSE_ALARMS = {"straggler named": "keeps the others waiting", "evicted": "evicted",
                "hang report": "HANG", "restart": "restarting the workers"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """Until ``port`` takes connections (node A's rendezvous); RuntimeError after
    ``timeout`` seconds or where ``proc`` ended."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"node A did not serve the rendezvous at port {port}")


def _environ() -> dict[str, str]:
    prefixes = ("SLURM", "OMPI", "PMI", "RANK", "LOCAL_", "WORLD_SIZE", "GROUP_", "MASTER_",
                "TORCHELASTIC", "UNIRANK", "PET_")
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


def run(seconds: float, folder: Path) -> dict[str, int]:
    """Run the job for ``seconds`` of training; how often each false alarm was said."""
    (folder / "worker.py").write_text(WORKER)
    stop = folder / "stop"
    port = _free_port()
    command = [sys.executable, "-m", "unirank", "run", "--nnodes", "1:2", "--nproc-per-node",
               "4", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--rdzv-id", "clean", str(folder / "worker.py"), str(stop)]
    logs = [folder / "node-a.log", folder / "node-b.log"]
    procs = []
    for log in logs:
        with log.open("wb") as sink:
            procs.append(subprocess.Popen(command, env=_environ(), stdout=sink,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True))
        _listening(port, procs[0])  # node A serves the endpoint: node B comes once it does
    try:
        time.sleep(seconds)
        stop.touch()
        for proc in procs:
            proc.wait(timeout=120)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    text = "\n".join(log.read_text(errors="replace") for log in logs)
    steps = sum(int(line.split()[3]) for line in text.splitlines()
                if line.startswith("rank ") and " steps " in line)
    counts = {kind: text.count(said) for kind, said in FALSE_ALARMS.items()}
    counts["ranks ended"] = text.count(" steps ")
    counts["steps (all ranks)"] = steps
    counts["exit codes 0"] = sum(proc.returncode == 0 for proc in procs)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="straggler-clean-") as folder:
        counts = run(args.seconds, Path(folder))
    for kind, count in counts.items():
        print(f"{kind}: {count}")
    clean = (all(counts[kind] == 0 for kind in FALSE_ALARMS) and counts["ranks ended"] == 8
             and counts["exit codes 0"] == 2)
    print(f"clean: {'yes' if clean else 'no'} ({args.seconds:g} s, 8 ranks on 2 nodes, steps "
          "of 0.1 s +-20 %, default settings)")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
