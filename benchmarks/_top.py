"""``unirank top``'s cost to the job it watches (benchmarks/run.py ``--only top``).

The training loop of benchmarks/_top_worker.py (DDP, 2 local ranks, the detector's default
settings) runs with the view closed and open (``unirank top --json`` beside it from its job
file on, its output thrown away), in alternation; the throughput is measured from 12 s on
(the view started, the watchers publishing their live records) and the ratio taken per pair
(median, quartiles). The bound whatever the machine's noise: each rank's watcher thread's CPU
time per second of its life (``--timeline-json``'s end-of-run records), closed and open.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = sys.executable


def _view(job: str, env: dict[str, str], run: subprocess.Popen[str]) -> subprocess.Popen[str]:
    """``unirank top --json --job JOB``, once the job's file is there (tried until then)."""
    deadline = time.monotonic() + 120
    while True:
        view = subprocess.Popen([PY, "-m", "unirank", "top", "--json", "--job", job], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            view.wait(timeout=3)
        except subprocess.TimeoutExpired:
            return view  # it runs: the job was found
        if time.monotonic() > deadline or run.poll() is not None:
            raise RuntimeError(f"unirank top never found job {job}: {view.stderr.read()}"
                               if view.stderr else job)


def _one(open_view: bool, number: int, env: dict[str, str], records: Path
         ) -> tuple[float, float]:
    """One run: its samples/s, and its watchers' CPU share of one core (summed over ranks)."""
    job = f"topbench-{os.getpid()}-{number}"
    run = subprocess.Popen([PY, "-m", "unirank", "run", "--rdzv-id", job, "--timeline-json",
                            str(records), "-n", "2", str(HERE / "_top_worker.py")], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    view = _view(job, env, run) if open_view else None
    out, err = run.communicate(timeout=600)
    if view is not None:
        view.wait(timeout=60)  # it ends with the job
    if run.returncode != 0:
        raise RuntimeError(err)
    rate = float(next(line.split()[1] for line in out.splitlines()
                      if line.startswith("SAMPLES_PER_S")))
    ranks = json.loads(records.read_text())
    cpu = sum(r["watcher"]["cpu_s"] for r in ranks)
    life = sum(r["watcher"]["life_s"] for r in ranks) / len(ranks)
    return rate, cpu / life


def bench_top(repeat: int, clean_env: Callable[[], dict[str, str]]) -> bool:
    """Closed and open in alternation, ``repeat`` pairs (module docstring); no target is
    asserted here: the figures go to docs/top.md."""
    env = clean_env()
    rates: dict[bool, list[float]] = {False: [], True: []}
    shares: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for number in range(repeat):
            for open_view in (False, True):
                rate, share = _one(open_view, number, env, Path(tmp) / "records.json")
                rates[open_view].append(rate)
                shares[open_view].append(share)
    ratios = sorted(o / c for o, c in zip(rates[True], rates[False]))
    q1, median, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    print(f"top: closed {statistics.median(rates[False]):.0f} samples/s, open "
          f"{statistics.median(rates[True]):.0f} samples/s (medians of {repeat}, 2 local ranks)")
    print(f"  {'view open / closed (samples/s, per pair)':<52} {median:8.3f}x  (quartiles "
          f"{q1:.3f}-{q3:.3f}; ratios {', '.join(f'{r:.3f}' for r in ratios)})")
    for open_view in (False, True):
        label = f"watchers' CPU, both ranks ({'open' if open_view else 'closed'})"
        print(f"  {label:<52} {100 * statistics.median(shares[open_view]):8.3f} % of one core")
    return True
