"""unirank's join at scale: simulated ranks against one real libuv TCPStore, next to torch's init.

    python3 benchmarks/scale.py [--quick] [--max N] [--sizes N ...] [--repeat R] [--mesh-max N]
                                [--budget S]

For N = 256, 1K, 4K, 16K and the most this box's open-file limit allows (each simulated rank is
one TCPStore client, i.e. one socket in the store server's process; the server runs in a process
of its own), the ranks are threads, at most --threads (256) per process and at least --procs
(cpu_count*8) processes, forked from a forkserver that imported torch once. Every rank connects
first; then each rank thread blocks on its own client until this script sets a gate key, so
process start-up and connecting are not timed, and runs, in turn and each time under fresh keys:

  join   unirank.joincheck.announce_and_wait (the unirank installed: src/)
  torch  the store traffic of torch 2.13's default init_process_group("gloo", "env://"):
         rendezvous add("init/") (+ rank 0 polling it every 10 ms), no store barrier
         (TORCH_DIST_INIT_BARRIER=0), gloo's full mesh: set own address (154 + 8 N bytes), then
         wait + get of every rank's address (itself included); O(N) calls per rank, O(N^2) in
         all. Simulated up to --mesh-max (1K: ~75 s on 2 cores), --mesh-repeat times (1).
  lazy   stand-in, not torch's default: TORCH_GLOO_LAZY_INIT=1 and its first ring all_reduce:
         the same rendezvous, set own address, wait + get of the 2 ring neighbours' addresses.

(_scale_worker.py says how these were read off torch and traced). Per N: wall time of each phase
from the first rank starting it to the last rank finishing it (median of --repeat runs, phases
interleaved), the join's tail (last rank starting -> last finishing) and start skew, unirank's
share (join / torch), store calls and keys named per rank (a counting wrapper store), the store
server's CPU time; then least-squares exponents of wall time over N (log-log; 1.0 = linear).

Target: join / torch <= 10 % at every N where torch's default was simulated, no rank failing,
and the join's exponent <= 1.15. Above --mesh-max the share is shown against a floor (torch's
time at the largest simulated N, scaled linearly) and against the lazy stand-in, not judged.
Exit 0 when met, else 1. Every wait has a timeout (--timeout), every N a deadline (--deadline),
the run a budget (--budget: an N predicted to end past it is skipped, and said so).

Trap of some hosts: torch's store client connects over ``::ffff:127.0.0.1`` and looks that name
up; without a DNS server about one connection in 25 stalls 5 s. As root this script appends
``::ffff:127.0.0.1 localhost`` to /etc/hosts when no line names that address (and says so);
otherwise it warns that timings include the stalls. A probe of 64 connects shows which it is.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import math
import os
import resource
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PY = sys.executable
WORKER = str(HERE / "_scale_worker.py")
HOST = "127.0.0.1"
MAPPED = "::ffff:127.0.0.1"
LADDER = [256, 1024, 4096, 16384]
SHARE_TARGET = 0.10
EXPONENT_TARGET = 1.15
PHASES = ("join", "mesh", "lazy")
LABEL = {"join": "join", "mesh": "torch", "lazy": "lazy"}
FD_RESERVE = 64  # the server process's own files (libuv, pipes, python)


def clean_env() -> dict[str, str]:
    prefixes = ("SLURM", "OMPI", "PMI", "PMIX", "RANK", "LOCAL_", "WORLD_SIZE", "GROUP_",
                "MASTER_", "TORCHELASTIC", "UNIRANK", "TORCH_GLOO", "TORCH_DIST")
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


# ---------------------------------------------------------------------------------------------
# environment: the /etc/hosts trap, the code under test


def hosts_has(address: str, path: str = "/etc/hosts") -> bool:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return False
    return any(line.split("#", 1)[0].split()[:1] == [address] for line in lines)


def handle_hosts_trap(fix: bool) -> bool:
    """True when the mapped loopback address resolves from /etc/hosts (added if need be)."""
    if hosts_has(MAPPED):
        print(f"hosts: /etc/hosts already names {MAPPED}: no DNS stalls expected")
        return True
    if not fix:
        print(f"hosts: WARNING no /etc/hosts line for {MAPPED} (--no-hosts-fix): timings may "
              "include 5 s DNS stalls")
        return False
    if os.geteuid() != 0:
        print(f"hosts: WARNING no /etc/hosts line for {MAPPED} and not root: timings may include "
              "5 s DNS stalls (add the line '::ffff:127.0.0.1 localhost' to /etc/hosts)")
        return False
    try:
        with open("/etc/hosts", "a") as fh:
            fh.write(f"\n{MAPPED} localhost  # added by unirank benchmarks/scale.py: torch's "
                     "store client looks up this name\n")
    except OSError as exc:
        print(f"hosts: WARNING could not add {MAPPED} to /etc/hosts ({exc}): timings may include "
              "5 s DNS stalls")
        return False
    print(f"hosts: ADDED the line '{MAPPED} localhost' to /etc/hosts (it was missing; torch's "
          "store client looks that name up, and without a DNS server 1 connect in ~25 stalls 5 s)")
    return True


def probe_connects(count: int = 64) -> float:
    """Seconds for ``count`` sequential store connects (fast unless name look-ups stall)."""
    from datetime import timedelta

    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    server = TCPStore(HOST, 0, None, True, timedelta(seconds=30), wait_for_workers=False,
                      use_libuv=True)
    start = time.perf_counter()
    clients = [TCPStore(HOST, server.port, None, False, timedelta(seconds=30),
                        wait_for_workers=False) for _ in range(count)]
    took = time.perf_counter() - start
    del clients, server
    return took


def joincheck_facts() -> dict[str, Any]:
    import unirank.joincheck as joincheck

    path = Path(joincheck.__file__)
    text = path.read_bytes()
    return {
        "path": str(path),
        "sha": hashlib.sha256(text).hexdigest()[:12],
        "has_add": b"add(" in text,
        "mtime": dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc)
        .strftime("%Y-%m-%d %H:%M:%S UTC"),
    }


def fd_cap() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0] - FD_RESERVE


# ---------------------------------------------------------------------------------------------
# processes


class Proc:
    """A child whose stdout carries JSON lines, read with deadlines."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        self._err = open(log, "wb")  # noqa: SIM115 - closed in close()
        self.p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self._err, env=clean_env(), start_new_session=True)
        self._buf = b""

    def read(self, deadline: float) -> dict[str, Any] | None:
        assert self.p.stdout is not None
        fd = self.p.stdout.fileno()
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        msg: dict[str, Any] = json.loads(line)
        return msg

    def stderr_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-800:]
        except OSError:
            return ""

    def close(self) -> None:
        if self.p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.p.pid, 9)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.p.wait(10)
        for stream in (self.p.stdin, self.p.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._err.close()


class RankProc:
    """A rank process forked by the forkserver (torch and joincheck imported once, before)."""

    def __init__(self, ctx: Any, cfg: dict[str, Any]) -> None:
        import _scale_worker

        self.conn, child = ctx.Pipe()
        self.p = ctx.Process(target=_scale_worker.rank_process, args=(cfg, child), daemon=True)
        self.p.start()
        child.close()

    def read(self, deadline: float) -> dict[str, Any] | None:
        try:
            if not self.conn.poll(max(deadline - time.monotonic(), 0.0)):
                return None
            msg: dict[str, Any] = self.conn.recv()
        except (EOFError, OSError):
            return None
        return msg

    def stderr_tail(self) -> str:
        return f"rank process {self.p.pid} exit code {self.p.exitcode}"

    def close(self) -> None:
        if self.p.is_alive():
            self.p.kill()
        self.p.join(10)
        self.conn.close()


_CTX: Any = None


def fork_context() -> Any:
    """A forkserver that has imported torch.distributed and the worker module (with joincheck):
    forking a rank process then costs milliseconds, not an ``import torch``."""
    global _CTX
    if _CTX is None:
        import multiprocessing

        _CTX = multiprocessing.get_context("forkserver")
        _CTX.set_forkserver_preload(["torch.distributed", "_scale_worker"])
    return _CTX


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / float(os.sysconf("SC_CLK_TCK"))
    except (OSError, IndexError, ValueError):
        return math.nan


class Aborted(RuntimeError):
    pass


def plan(phases: list[str], repeat: int, mesh_repeat: int) -> list[list[Any]]:
    """The steps of one N: the phases interleaved, the full mesh in the first runs only."""
    return [[rep, phase] for rep in range(repeat) for phase in phases
            if phase != "mesh" or rep < mesh_repeat]


def run_world(n: int, procs: int, steps: list[list[Any]], timeout: float,
              deadline_s: float, tmp: Path, switch_interval: float) -> dict[str, Any]:
    # (procs: processes the ranks are spread over, threads = ranks / procs each)
    """All steps of one N: returns per-phase lists of step results, and facts of the run."""
    begin = time.monotonic()
    deadline = begin + deadline_s
    phases = sorted({phase for _, phase in steps}, key=PHASES.index)
    server = Proc([PY, WORKER, "server", HOST, str(deadline_s + 30)], tmp / f"server-{n}.log")
    workers: list[RankProc] = []
    gate: Any = None
    try:
        hello = server.read(min(deadline, time.monotonic() + 120))
        if not hello:
            raise Aborted(f"store server did not start: {server.stderr_tail()}")
        port, server_pid = hello["port"], hello["pid"]
        bounds = [round(i * n / procs) for i in range(procs + 1)]
        for index in range(procs):
            cfg = {"host": HOST, "port": port, "world": n,
                   "ranks": [bounds[index], bounds[index + 1]],
                   "timeout": timeout, "steps": steps, "deadline": deadline_s,
                   "switch_interval": switch_interval}
            workers.append(RankProc(fork_context(), cfg))
        shas, connect = set(), []
        for w in workers:
            msg = w.read(deadline)
            if not msg or "ready" not in msg:
                raise Aborted(f"a rank process did not get ready: {msg or w.stderr_tail()}")
            shas.add(msg["joincheck_sha"])
            connect.append(msg["connect_s"])
        setup_s = time.monotonic() - begin
        from datetime import timedelta

        from torch.distributed import TCPStore  # type: ignore[attr-defined]

        gate = TCPStore(HOST, port, None, False, timedelta(seconds=60), wait_for_workers=False)
        out: dict[str, list[dict[str, Any]]] = {p: [] for p in phases}
        for i, (_rep, phase) in enumerate(steps):
            cpu0 = cpu_seconds(server_pid)
            gate.set(f"gate/{i}", "go")  # every rank, blocked on this key, starts
            parts = []
            for w in workers:
                msg = w.read(deadline)
                if not msg or msg.get("step") != i:
                    raise Aborted(f"step {i} ({LABEL[phase]}) did not finish within the "
                                  f"{deadline_s:.0f} s deadline for N={n}: "
                                  f"{msg or w.stderr_tail() or 'no answer'}")
                parts.append(msg)
            cpu1 = cpu_seconds(server_pid)
            out[phase].append(merge(parts, n, cpu1 - cpu0))
        return {"phases": out, "shas": sorted(shas), "setup_s": setup_s,
                "connect_s": max(connect), "procs": procs,
                "threads": max(bounds[i + 1] - bounds[i] for i in range(procs)),
                "elapsed": time.monotonic() - begin}
    finally:
        del gate
        for w in workers:
            w.close()
        server.close()


def merge(parts: list[dict[str, Any]], n: int, server_cpu: float) -> dict[str, Any]:
    calls: dict[str, int] = {}
    keys: dict[str, int] = {}
    for part in parts:
        for k, v in part["calls"].items():
            calls[k] = calls.get(k, 0) + v
        for k, v in part["keys"].items():
            keys[k] = keys.get(k, 0) + v
    first = min(p["first_start"] for p in parts)
    return {
        "wall": max(p["last_end"] for p in parts) - first,
        "skew": max(p["last_start"] for p in parts) - first,
        "tail": max(p["last_end"] for p in parts) - max(p["last_start"] for p in parts),
        "calls": calls,
        "keys": keys,
        "calls_per_rank": sum(calls.values()) / n,
        "keys_per_rank": sum(keys.values()) / n,
        "max_calls": max(p["max_calls"] for p in parts),
        "max_keys": max(p["max_keys"] for p in parts),
        "errors": sum(p["errors"] for p in parts),
        "first_errors": [e for p in parts for e in p["first_errors"]][:3],
        "server_cpu": server_cpu,
    }


# ---------------------------------------------------------------------------------------------
# analysis and report


def slope(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of log(value) over log(N)."""
    pts = [(math.log(n), math.log(v)) for n, v in points if v > 0]
    if len(pts) < 2:
        return None
    mx = statistics.fmean(x for x, _ in pts)
    my = statistics.fmean(y for _, y in pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else None


def med(rows: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in rows))


def breakdown(row: dict[str, Any], n: int) -> str:
    order = ["set", "add", "get", "wait", "check", "multi_get", "multi_set", "compare_set"]
    names = sorted(row["calls"], key=lambda k: (order.index(k) if k in order else 99, k))
    return " ".join(f"{k} {fmt_num(row['calls'][k] / n)}" for k in names)


def fmt_num(x: float) -> str:
    return f"{x:.0f}" if abs(x - round(x)) < 0.005 else f"{x:.2f}"


def fmt_n(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 and n >= 1024 else str(n)


def report(results: dict[int, dict[str, Any]], facts: dict[str, Any]) -> list[str]:
    """Print the tables; return what missed."""
    misses: list[str] = []
    ns = sorted(results)
    print()
    print("wall time, first rank starting -> last rank finishing (median of the repeats); "
          "share = join / that part;\n(tail = join's last rank starting -> last rank finishing; "
          "start skew = first -> last rank starting the join; srv cpu = store server process "
          "CPU s)")
    head = (f"{'N':>6} {'procs x thr':>11} {'rep':>3} {'join s':>8} {'(tail)':>8} "
            f"{'torch s':>8} {'join/torch':>10} {'lazy s':>8} {'join/lazy':>9}   "
            f"{'srv cpu join/torch/lazy':>24} {'start skew':>10}")
    print(head)
    print("-" * len(head))
    meshed = [n for n in ns if results[n]["phases"].get("mesh")]
    for n in ns:
        res = results[n]
        ph = res["phases"]
        join = med(ph["join"], "wall")
        mesh = med(ph["mesh"], "wall") if ph.get("mesh") else None
        lazy = med(ph["lazy"], "wall") if ph.get("lazy") else None
        cpu = "/".join(f"{med(ph[p], 'server_cpu'):.2f}" if ph.get(p) else "-" for p in PHASES)
        skew = med(ph["join"], "skew")
        share_mesh = join / mesh if mesh else None
        share_lazy = join / lazy if lazy else None
        torch_cell, share_cell = "n/a", "n/a"
        if mesh is not None and share_mesh is not None:
            torch_cell, share_cell = f"{mesh:.3f}", f"{share_mesh * 100:.1f} %"
        elif meshed and n > meshed[-1]:  # not simulated: a floor, linear from the largest N
            floor = med(results[meshed[-1]]["phases"]["mesh"], "wall") * n / meshed[-1]
            torch_cell, share_cell = f">={floor:.0f}", f"<={join / floor * 100:.2f} %"
        print(f"{fmt_n(n):>6} {res['procs']:>4} x {res['threads']:<4} {len(ph['join']):>3} "
              f"{join:8.3f} {med(ph['join'], 'tail'):8.3f} {torch_cell:>8} {share_cell:>10} "
              f"{lazy if lazy is not None else math.nan:8.3f} "
              f"{(f'{share_lazy * 100:.1f} %') if share_lazy is not None else 'n/a':>9}   "
              f"{cpu:>24} {skew * 1000:8.1f}ms")
        if share_mesh is not None and share_mesh > SHARE_TARGET:
            misses.append(f"N={fmt_n(n)}: join {join:.3f} s is {share_mesh * 100:.1f} % of "
                          f"torch's default init traffic {mesh:.3f} s "
                          f"(target <= {SHARE_TARGET:.0%})")
        for phase in PHASES:
            for row in ph.get(phase, []):
                if row["errors"]:
                    misses.append(f"N={fmt_n(n)} {LABEL[phase]}: {row['errors']} ranks failed, "
                                  f"e.g. {row['first_errors'][0]}")
                    break
    print()
    print("store operations per rank: calls (keys named), mean over ranks [max rank], from the "
          "counting wrapper; breakdown = calls per rank by method")
    for phase in PHASES:
        if not any(results[n]["phases"].get(phase) for n in ns):
            continue
        print(f"  {LABEL[phase]}:")
        for n in ns:
            rows = results[n]["phases"].get(phase)
            if not rows:
                continue
            row = rows[0]
            print(f"  {fmt_n(n):>8}  {fmt_num(row['calls_per_rank']):>7} calls "
                  f"({fmt_num(row['keys_per_rank'])} keys) [max {row['max_calls']} calls, "
                  f"{row['max_keys']} keys]   {breakdown(row, n)}")
    print()
    exps: dict[str, float | None] = {}
    for phase in PHASES:
        pts = [(n, med(results[n]["phases"][phase], "wall")) for n in ns
               if results[n]["phases"].get(phase)]
        exps[phase] = slope(pts)
        cpu_pts = [(n, med(results[n]["phases"][phase], "server_cpu")) for n in ns
                   if results[n]["phases"].get(phase)]
        e, c = exps[phase], slope(cpu_pts)
        if not pts:
            continue
        span = ", ".join(fmt_n(n) for n, _ in pts)
        print(f"exponent of {LABEL[phase]:<5} wall time over N ({span}): "
              f"{'n/a' if e is None else f'{e:.2f}'}"
              f"   (server CPU: {'n/a' if c is None else f'{c:.2f}'})")
    e = exps["join"]
    if e is None:
        misses.append("join exponent: fewer than 2 N measured")
    elif e > EXPONENT_TARGET:
        misses.append(f"join wall-time exponent {e:.2f} > {EXPONENT_TARGET}")
    big = [n for n in ns if not results[n]["phases"].get("mesh")]
    if big and not meshed:
        print("torch's default full mesh not simulated at any N (--mesh-max): no share judged")
    elif big:
        print(f"N = {', '.join(fmt_n(n) for n in big)}: torch's default full mesh not simulated "
              f"(> --mesh-max: O(N^2) store calls in all); '>=' is a floor, torch's wall time at "
              f"the largest simulated N scaled linearly (its calls per rank grow as N, so the "
              f"true time grows faster), and the share against it is shown, not judged; "
              f"join/lazy compares with the O(1)-per-rank lazy stand-in, also not judged")
    return misses


# ---------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, default=None, help="largest N to run")
    parser.add_argument("--quick", action="store_true", help="N = 256 and 1K only")
    parser.add_argument("--sizes", type=int, nargs="+", default=None,
                        help="run exactly these N (up to the open-file cap)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each phase per N, interleaved, medians (default 3)")
    parser.add_argument("--mesh-repeat", type=int, default=1,
                        help="runs of the full-mesh phase per N (default 1: it takes ~4 s at "
                             "256 and ~75 s at 1K on 2 cores)")
    parser.add_argument("--mesh-max", type=int, default=1024,
                        help="largest N at which torch's full-mesh traffic is simulated "
                             "(O(N^2) store calls in all; default 1024)")
    parser.add_argument("--procs", type=int, default=(os.cpu_count() or 2) * 8,
                        help="processes the ranks are spread over, at least (default "
                             "cpu_count*8)")
    parser.add_argument("--threads", type=int, default=256,
                        help="ranks (threads) per process, at most: more processes for a "
                             "larger N (default 256; waking thousands of threads in one "
                             "process takes seconds)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="each rank's timeout for one phase, seconds (default 300)")
    parser.add_argument("--deadline", type=float, default=480.0,
                        help="whole-run deadline of one N, seconds (default 480)")
    parser.add_argument("--budget", type=float, default=600.0,
                        help="skip an N that would end past this many seconds of the run "
                             "(default 600)")
    parser.add_argument("--switch-interval", type=float, default=0.25,
                        help="sys.setswitchinterval of the rank processes (default 0.25 s: "
                             "with 5 ms, thousands of threads waking at once storm the GIL)")
    parser.add_argument("--no-hosts-fix", action="store_true",
                        help="never add the ::ffff:127.0.0.1 line to /etc/hosts")
    args = parser.parse_args()
    run_start = time.monotonic()

    facts = joincheck_facts()
    import torch

    cap = fd_cap()
    ladder = [256, 1024] if args.quick else [*LADDER, cap]
    if args.sizes:
        ladder = list(args.sizes)
    if args.max is not None:
        ladder = [n for n in ladder if n <= args.max]
        if not args.quick and args.max not in ladder and args.max < cap:
            ladder.append(args.max)
    ladder = sorted({n for n in ladder if 2 <= n <= cap})

    print(f"scale: {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')}, "
          f"torch {torch.__version__}, python {sys.version.split()[0]}, "
          f"{os.cpu_count()} cpus, open files {resource.getrlimit(resource.RLIMIT_NOFILE)[0]} "
          f"(N <= {cap} with the server in its own process)")
    print(f"joincheck: {facts['path']} sha256 {facts['sha']} (modified {facts['mtime']}), "
          f"{'has' if facts['has_add'] else 'has NO'} 'add(' "
          f"({'O(1) counter protocol' if facts['has_add'] else 'no counter: per-rank O(N) wait'})")
    print(f"stand-ins: torch = store traffic of init_process_group('gloo', 'env://') with 2.13's "
          f"defaults (rendezvous add + rank-0 poll, no barrier, gloo full mesh: N wait+get per "
          f"rank) up to N={args.mesh_max}; lazy = TORCH_GLOO_LAZY_INIT=1 + first ring "
          f"all_reduce (set + wait/get of 2 neighbours), not the default")
    handle_hosts_trap(fix=not args.no_hosts_fix)
    probe = probe_connects()
    print(f"probe: 64 store connects in {probe:.2f} s"
          + ("" if probe < 2.0 else "  WARNING: name look-ups stall; timings include them"))
    print(f"N to run: {', '.join(fmt_n(n) for n in ladder)}; ranks over "
          f">= {args.procs} processes of <= {args.threads} threads; budget {args.budget:.0f} s")

    results: dict[int, dict[str, Any]] = {}
    misses: list[str] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="unirank-scale-") as tmpdir:
        tmp = Path(tmpdir)
        last: tuple[int, dict[str, Any]] | None = None
        for n in ladder:
            phases = ["join", "mesh", "lazy"] if n <= args.mesh_max else ["join", "lazy"]
            repeat = args.repeat
            steps = plan(phases, repeat, args.mesh_repeat)
            left = args.budget - (time.monotonic() - run_start)
            if last is not None:
                guess = predict(last, n, steps)
                if guess > left:
                    notes.append(f"N={fmt_n(n)} skipped: predicted {guess:.0f} s > {left:.0f} s "
                                 f"left of --budget")
                    print(notes[-1])
                    break
            if left <= 10:
                notes.append(f"N={fmt_n(n)} skipped: budget spent")
                print(notes[-1])
                break
            t0 = time.monotonic()
            print(f"N={fmt_n(n)}: {', '.join(LABEL[p] for p in phases)} x {repeat}"
                  + (f" (torch x {min(repeat, args.mesh_repeat)})" if "mesh" in phases else "")
                  + " ...", flush=True)
            try:
                procs = min(n, max(args.procs, math.ceil(n / args.threads)))
                res = run_world(n, procs, steps, min(args.timeout, left),
                                min(args.deadline, left), tmp, args.switch_interval)
            except Aborted as exc:
                misses.append(f"N={fmt_n(n)} aborted after {time.monotonic() - t0:.0f} s: "
                              f"{' '.join(str(exc).split())[:600]}")
                print(misses[-1])
                break
            if res["shas"] != [facts["sha"]]:
                notes.append(f"N={fmt_n(n)} ran joincheck {', '.join(res['shas'])}, not "
                             f"{facts['sha']}: joincheck.py changed during the run")
                print(notes[-1])
            print(f"N={fmt_n(n)}: {res['elapsed']:.1f} s ({res['setup_s']:.1f} s start-up, "
                  f"connects {res['connect_s']:.1f} s)", flush=True)
            results[n] = res
            last = (n, res)

    if results:
        misses = report(results, facts) + misses
    else:
        misses.append("no N measured")
    print()
    for note in notes:
        print(f"note: {note}")
    print(f"total {time.monotonic() - run_start:.0f} s; largest N measured: "
          f"{fmt_n(max(results)) if results else 'none'}")
    if misses:
        print("MISS:")
        for miss in misses:
            print(f"  {miss}")
        return 1
    print(f"OK: join <= {SHARE_TARGET:.0%} of torch's init traffic at every N where it was "
          f"simulated, join exponent <= {EXPONENT_TARGET}")
    return 0


def predict(last: tuple[int, dict[str, Any]], n: int, steps: list[list[Any]]) -> float:
    """Rough seconds for N: process start-up as it was, connects and the O(1)-per-rank phases
    as N, the full mesh as N^2."""
    n0, res = last
    r = n / n0
    total = float(res["setup_s"] - res["connect_s"] + res["connect_s"] * r)
    for _, phase in steps:
        rows = res["phases"].get(phase)
        if rows:
            total += med(rows, "wall") * (r * r if phase == "mesh" else r)
        elif phase == "mesh":
            return math.inf  # never simulated at a smaller N: cannot tell
    return total


if __name__ == "__main__":
    sys.exit(main())
