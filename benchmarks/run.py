"""unirank's performance harness: ratios measured side by side in one run (interleaved, medians).

    python3 benchmarks/run.py [--repeat N] [--only NAME ...]

Targets (2-core machine; torchrun is `python -m torch.distributed.run` and unirank
`python -m unirank`, both with this interpreter's binary, never a shell shim):
  start    `unirank run -n 2 hello` / `torchrun --standalone --nproc_per_node 2 hello`  <= 0.40
  start8   `unirank run -n 8 hello` / `torchrun --standalone --nproc_per_node 8 hello`  <= 0.35
           (also shown, no target: `unirank run --no-preload -n 8` / the same torchrun)
  pss8     summed PSS of 8 started workers (+ fork server / agent), unirank vs torchrun
           (no target: figures)
  cold8    start-up of 8 workers after `echo 3 > /proc/sys/vm/drop_caches`, unirank /
           torchrun, interleaved (no target; skipped when not root or not permitted)
  cli      `unirank --help`, `unirank info` cold start / `python -c pass`              <= 4x
  reduce   per-call `ur.all_reduce` / `dist.all_reduce` on a 4-byte tensor            <= 1.03x
  init16   init latency of 16 local ranks under `unirank run`, worst of 5             <= 150 ms
  ddp      time to the first DDP training step (launch to the last rank's first AdamW step
           done), `unirank run -n 2` / `torchrun --standalone -n 2`      (no target: figures)
  ddp8     the same with 8 workers                                                      <= 0.30
           (both also show, no target: `unirank run --no-preload` / the same torchrun)
  ssh      start-up over ssh on the testbed's two hosts: `unirank run --hosts node1:2,node2:2
           hello` / one `ssh HOST torchrun --nnodes 2 --node_rank I` per host in parallel
           (DeepSpeed's way); benchmarks/_ssh.py                           (no target: figures)
  train    samples/s of examples/train.py's loop with ur.auto_* / the same written by hand
           (DDP + DistributedSampler), 2 local ranks, interleaved runs                  >= 0.98
           (init latency = last rank leaving init_process_group - last rank entering it, i.e.
           the cost of the rendezvous itself, not the wait for slower ranks' `import torch`)
  hang     samples/s of the same loop (by hand) with the hang detector on (its default
           interval 5 s, and every 0.25 s) / off (`--hang-report-after off`), 2 local ranks,
           interleaved runs, the ratio per pair (median, quartiles)                    >= 0.99
           (also shown, no target: the watcher thread's own CPU time per interval, from
           its time.thread_time, which bounds the cost whatever the machine's noise; and
           the 20 looks a second alone, A/B in alternating windows of one training process:
           benchmarks/_look_ab_worker.py)
  top      samples/s of that loop with `unirank top` open beside it / closed, 2 local ranks,
           interleaved runs, the ratio per pair; the watchers' CPU time open and closed
           (benchmarks/_top.py; no target asserted: docs/top.md has the figures)
  elastic  recovery with default settings, the same command twice on one host (`--nnodes
           1:2 --nproc-per-node 1 --max-restarts 3 --rdzv-backend c10d`), unirank run beside
           torchrun's agent: a killed node (<= 6 s and <= 0.2x), a frozen node (<= 10 s),
           the endpoint's node killed (<= 10 s), a killed node started again (the world
           back to 2), a stuck rank (unirank: no hang option, the learned timeout, <= 8 s);
           benchmarks/_elastic.py
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import _pss
from _elastic import bench_elastic
from _ssh import bench_ssh
from _top import bench_top

HERE = Path(__file__).resolve().parent
PY = sys.executable
HELLO = str(HERE / "_hello_worker.py")
DDP_STEP = str(HERE / "_ddp_step_worker.py")


def clean_env() -> dict[str, str]:
    prefixes = ("SLURM", "OMPI", "PMI", "PMIX", "RANK", "LOCAL_", "WORLD_SIZE", "GROUP_",
                "MASTER_", "TORCHELASTIC", "UNIRANK")
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


def wall(cmd: Sequence[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env or clean_env(), check=True, timeout=300,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def interleaved(cmds: dict[str, Sequence[str]], repeat: int) -> dict[str, float]:
    """Median wall time of each command, run in alternation ``repeat`` times."""
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(repeat):
        for name, cmd in cmds.items():
            times[name].append(wall(cmd))
    return {name: statistics.median(ts) for name, ts in times.items()}


def report(name: str, value: float, target: float, unit: str, better: str = "lower") -> bool:
    ok = value <= target if better == "lower" else value >= target
    print(f"  {name:<52} {value:8.3f}{unit}  target <= {target}{unit}  {'OK' if ok else 'MISS'}")
    return ok


def unirank_run(n: int, script: str, *flags: str) -> list[str]:
    return [PY, "-m", "unirank", "run", *flags, "-n", str(n), script]


def torchrun(n: int, script: str) -> list[str]:
    return [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n), script]


def bench_start(repeat: int) -> bool:
    med = interleaved({"unirank": unirank_run(2, HELLO), "torchrun": torchrun(2, HELLO)}, repeat)
    print(f"start: unirank run -n 2 {med['unirank']:.3f}s, torchrun -n 2 {med['torchrun']:.3f}s "
          f"(medians of {repeat})")
    return report("unirank run -n 2 / torchrun --standalone -n 2", med["unirank"] / med["torchrun"],
                  0.40, "x")


def bench_start8(repeat: int) -> bool:
    med = interleaved(
        {
            "unirank": unirank_run(8, HELLO),
            "no-preload": unirank_run(8, HELLO, "--no-preload"),
            "torchrun": torchrun(8, HELLO),
        },
        repeat,
    )
    print(f"start8: unirank run -n 8 {med['unirank']:.3f}s, --no-preload "
          f"{med['no-preload']:.3f}s, torchrun -n 8 {med['torchrun']:.3f}s (medians of {repeat})")
    print(f"  {'unirank run --no-preload -n 8 / torchrun -n 8':<52} "
          f"{med['no-preload'] / med['torchrun']:8.3f}x  (no target)")
    return report("unirank run -n 8 / torchrun --standalone -n 8", med["unirank"] / med["torchrun"],
                  0.35, "x")


def first_step(cmd: Sequence[str], n: int) -> float:
    """Seconds from launching ``cmd`` to the last of its ``n`` ranks finishing its first step."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**clean_env(), "UNIRANK_BENCH_TIMES": tmp}
        launched = time.time()
        subprocess.run(cmd, env=env, check=True, timeout=300, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        marks = [json.loads(p.read_text())["first_step"] for p in Path(tmp).glob("*.json")]
    assert len(marks) == n, f"expected {n} ranks' first steps, got {len(marks)}"
    return max(marks) - launched


def bench_first_step(n: int, target: float | None, repeat: int) -> bool:
    cmds = {"unirank": unirank_run(n, DDP_STEP), "no-preload": unirank_run(n, DDP_STEP,
                                                                          "--no-preload"),
            "torchrun": torchrun(n, DDP_STEP)}
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(repeat):
        for name, cmd in cmds.items():
            times[name].append(first_step(cmd, n))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"ddp first step, -n {n}: unirank run {med['unirank']:.3f}s, --no-preload "
          f"{med['no-preload']:.3f}s, torchrun {med['torchrun']:.3f}s (medians of {repeat}; "
          f"load average {os.getloadavg()[0]:.2f})")
    print(f"  {f'first DDP step: --no-preload -n {n} / torchrun -n {n}':<52} "
          f"{med['no-preload'] / med['torchrun']:8.3f}x  (no target)")
    label = f"first DDP step: unirank run -n {n} / torchrun -n {n}"
    if target is None:
        print(f"  {label:<52} {med['unirank'] / med['torchrun']:8.3f}x  (no target)")
        return True
    return report(label, med["unirank"] / med["torchrun"], target, "x")


def bench_ddp(repeat: int) -> bool:
    return bench_first_step(2, None, repeat)


def bench_ddp8(repeat: int) -> bool:
    return bench_first_step(8, 0.30, repeat)


def bench_pss8(repeat: int) -> bool:
    cmds = {"unirank": unirank_run(8, _pss.PSS_WORKER), "torchrun": torchrun(8, _pss.PSS_WORKER)}
    parent = {"unirank": "fork server", "torchrun": "agent"}
    samples: dict[str, list[dict[str, int]]] = {name: [] for name in cmds}
    for _ in range(max(1, repeat // 2)):
        for name, cmd in cmds.items():
            samples[name].append(_pss.job_pss(cmd, 8, clean_env()))
    print(f"pss8: summed PSS of 8 workers held after init + barrier, MiB (medians of "
          f"{len(samples['unirank'])})")
    totals = {}
    for name, rows in samples.items():
        med = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
        mib = {key: med[key] / 1024 for key in ("workers", "parent", "launcher")}
        totals[name] = sum(mib.values())
        print(f"  {name:<9} workers {mib['workers']:7.1f}  {parent[name]} {mib['parent']:6.1f}  "
              f"launcher {mib['launcher']:5.1f}  total {totals[name]:7.1f}  "
              f"({med['processes']:.0f} processes)")
    print(f"  {'total PSS unirank / torchrun':<52} {totals['unirank'] / totals['torchrun']:8.3f}x"
          "  (no target)")
    return True


def drop_caches() -> str | None:
    """Write back and drop the page cache; the reason it could not be done, or None."""
    if os.geteuid() != 0:
        return "not root"
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as exc:
        return f"/proc/sys/vm/drop_caches: {exc.strerror}"
    return None


def bench_cold8(repeat: int) -> bool:
    cmds = {"unirank": unirank_run(8, HELLO), "torchrun": torchrun(8, HELLO)}
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(repeat):
        for name, cmd in cmds.items():
            why = drop_caches()
            if why:
                print(f"cold8: skipped, cannot drop the page cache ({why})")
                return True
            times[name].append(wall(cmd))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"cold8: unirank run -n 8 {med['unirank']:.3f}s, torchrun -n 8 {med['torchrun']:.3f}s "
          f"after dropping the page cache (medians of {repeat})")
    print(f"  {'cold: unirank run -n 8 / torchrun -n 8':<52} "
          f"{med['unirank'] / med['torchrun']:8.3f}x  (no target)")
    return True


def bench_cli(repeat: int) -> bool:
    # the console script next to this interpreter, not a shell shim found first on PATH
    unirank = shutil.which("unirank", path=str(Path(PY).parent)) or "unirank"
    med = interleaved(
        {
            "pass": [PY, "-c", "pass"],
            "help": [unirank, "--help"],
            "info": [unirank, "info"],
        },
        repeat,
    )
    print(f"cli: python -c pass {med['pass']*1000:.1f} ms, unirank --help "
          f"{med['help']*1000:.1f} ms, unirank info {med['info']*1000:.1f} ms")
    ok = report("unirank --help / python -c pass", med["help"] / med["pass"], 4.0, "x")
    return report("unirank info / python -c pass", med["info"] / med["pass"], 4.0, "x") and ok


def bench_reduce(repeat: int) -> bool:
    cmd = [PY, "-m", "unirank", "run", "-n", "2", str(HERE / "_allreduce_worker.py")]
    ratios = []
    for _ in range(max(1, repeat // 3)):
        out = subprocess.run(cmd, env=clean_env(), check=True, timeout=300, capture_output=True,
                             text=True).stdout
        data = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
        ratios.append(data["unirank"] / data["dist"])
        print(f"reduce: dist.all_reduce {data['dist']*1e6:.1f} us/call, "
              f"ur.all_reduce {data['unirank']*1e6:.1f} us/call")
    return report("ur.all_reduce / dist.all_reduce (4 bytes)", statistics.median(ratios), 1.03,
                  "x")


def bench_init16(repeat: int) -> bool:
    worst = 0.0
    for _ in range(5):
        with tempfile.TemporaryDirectory() as tmp:
            env = {**clean_env(), "UNIRANK_BENCH_TIMES": tmp}
            subprocess.run([PY, "-m", "unirank", "run", "-n", "16", HELLO], env=env, check=True,
                           timeout=600, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            marks = [json.loads(p.read_text()) for p in Path(tmp).glob("*.json")]
            assert len(marks) == 16, f"expected 16 ranks' times, got {len(marks)}"
            latency = max(m["end"] for m in marks) - max(m["start"] for m in marks)
            worst = max(worst, latency)
            print(f"init16: init latency {latency*1000:.1f} ms")
    return report("init of 16 local ranks (worst of 5)", worst * 1000, 150, " ms")


def bench_train(repeat: int) -> bool:
    rates: dict[str, list[float]] = {"auto": [], "hand": []}
    for _ in range(repeat):
        for mode in rates:
            out = subprocess.run([PY, "-m", "unirank", "run", "-n", "2",
                                  str(HERE / "_train_worker.py"), mode], env=clean_env(),
                                 check=True, timeout=600, capture_output=True, text=True).stdout
            rates[mode].append(float(next(line.split()[1] for line in out.splitlines()
                                          if line.startswith("SAMPLES_PER_S"))))
    auto, hand = statistics.median(rates["auto"]), statistics.median(rates["hand"])
    print(f"train: ur.auto_* {auto:.0f} samples/s, by hand {hand:.0f} samples/s "
          f"(medians of {repeat}, 2 local ranks)")
    ok = auto / hand >= 0.98
    print(f"  {'auto_* / by hand (samples/s)':<52} {auto / hand:8.3f}x  target >= 0.98x  "
          f"{'OK' if ok else 'MISS'}")
    return ok


def _samples_per_s(flags: Sequence[str], env: dict[str, str],
                   records: Path | None = None) -> float:
    """One run of the training loop; with ``records``, its end-of-run records are written
    there (``--timeline-json``: each rank's hang watcher's CPU time and records)."""
    extra = ["--timeline-json", str(records)] if records is not None else []
    out = subprocess.run([PY, "-m", "unirank", "run", *flags, *extra, "-n", "2",
                          str(HERE / "_train_worker.py"), "hand"], env=env,
                         check=True, timeout=600, capture_output=True, text=True).stdout
    return float(next(line.split()[1] for line in out.splitlines()
                      if line.startswith("SAMPLES_PER_S")))


def _quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return q1, q2, q3


def _watcher_cost(path: Path) -> tuple[float, float, float]:
    """Every rank's hang watcher thread: CPU seconds, seconds it lived, and its interval."""
    cpu, life, interval = 0.0, 0.0, 0.0
    for record in json.loads(path.read_text()):
        cpu += record["watcher"]["cpu_s"]
        life += record["watcher"]["life_s"]
        interval = record["collectives"]["interval"]
    return cpu, life, interval


def bench_hang(repeat: int) -> bool:
    """The hang detector's cost: its thread reads the flight recorder's status every 50 ms
    (time in collectives) and sets one store key per interval on every rank (rank 0 also reads
    every rank's key). Off and on run in alternation (``repeat`` pairs, every run with
    ``--timeline-json`` so that both pay the same), the ratio is taken per pair (median and
    quartiles); the watcher's own CPU time (its thread's ``time.thread_time``) per interval
    bounds the cost independently of the machine's noise."""
    base = dict(clean_env(), BENCH_EPOCHS="30")  # 10-20 s a run: a few 5 s intervals
    fast = dict(base, UNIRANK_HANG_INTERVAL="0.25")
    modes: dict[str, tuple[list[str], dict[str, str]]] = {
        "off": (["--hang-report-after", "off"], base),
        "on": ([], base),
        "on, every 0.25 s": ([], fast),
    }
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    costs: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as tmp:
        records = Path(tmp) / "records.json"
        for _ in range(repeat):
            for mode, (flags, env) in modes.items():
                rates[mode].append(_samples_per_s(flags, env, records))
                if mode != "off":
                    costs[mode].append(_watcher_cost(records))
    medians = {mode: statistics.median(values) for mode, values in rates.items()}
    print("hang: " + ", ".join(f"{mode} {rate:.0f} samples/s" for mode, rate in medians.items())
          + f" (medians of {repeat}, 2 local ranks, interleaved)")
    ok = True
    for mode in ("on", "on, every 0.25 s"):
        q1, ratio, q3 = _quartiles([on / off for on, off in zip(rates[mode], rates["off"])])
        ok = ok and (mode != "on" or ratio >= 0.99)
        target = "target >= 0.99x  " + ("OK" if ratio >= 0.99 else "MISS") if mode == "on" \
            else "(no target)"
        print(f"  {'detector ' + mode + ' / off (samples/s, per pair)':<52} {ratio:8.3f}x  "
              f"{target}  (quartiles {q1:.3f}-{q3:.3f})")
        share = sum(c for c, _, _ in costs[mode]) / sum(life for _, life, _ in costs[mode])
        interval = costs[mode][0][2]
        print(f"  {'watcher thread CPU per interval (' + mode + ')':<52} "
              f"{share * interval * 1e3:8.2f} ms  = {100 * share:.3f} % of one core "
              f"({interval:g} s interval, 20 looks a second included)")
    out = subprocess.run([PY, str(HERE / "_look_ab_worker.py"), str(4 * repeat)], env=base,
                         check=True, timeout=600, capture_output=True, text=True).stdout
    median, q1, q3, pairs, _ = next(line.split()[1:] for line in out.splitlines()
                                    if line.startswith("LOOK_AB"))
    print(f"  {'looks every 50 ms / none, in one process (steps/s)':<52} {float(median):8.3f}x"
          f"  (no target)  (quartiles {float(q1):.3f}-{float(q3):.3f}, {pairs} pairs of "
          f"0.5 s windows)")
    return ok


BENCHES: dict[str, Callable[[int], bool]] = {
    "start": bench_start,
    "start8": bench_start8,
    "pss8": bench_pss8,
    "cold8": bench_cold8,
    "cli": bench_cli,
    "reduce": bench_reduce,
    "init16": bench_init16,
    "train": bench_train,
    "hang": bench_hang,
    "top": lambda repeat: bench_top(repeat, clean_env),
    "ddp": bench_ddp,
    "ddp8": bench_ddp8,
    "ssh": bench_ssh,
    "elastic": bench_elastic,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs of each command (default 7)")
    parser.add_argument("--only", nargs="*", choices=sorted(BENCHES), help="benchmarks to run")
    args = parser.parse_args()
    results = {name: BENCHES[name](args.repeat) for name in (args.only or BENCHES)}
    print("summary:", ", ".join(f"{k}={'OK' if v else 'MISS'}" for k, v in results.items()))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
