"""A lost node: the time from node B's SIGKILL to the first step of node A's restarted workers,
``unirank run`` / torchrun's own elastic agent (``python -m torch.distributed.run``), side by
side, the same options and script.

Two nodes on loopback aliases (A 127.0.1.1, the rendezvous endpoint; B 127.0.1.2), each its own
launcher with ``--local-addr``: ``--nnodes 1:2 --nproc-per-node 2 --max-restarts 3
--rdzv-backend c10d --rdzv-endpoint 127.0.1.1:PORT --rdzv-conf`` :data:`CONF`. B starts once
A's rendezvous store listens (so A serves it under both launchers); once the world of 4 ran a
few steps, B is killed with SIGKILL, two ways:

* ``node``: B's launcher and every process below it at once (a lost machine). This is the fair
  case: torchrun's workers do not die with their agent (nothing tells them), so killing
  its agent alone loses no worker;
* ``launcher``: B's launcher alone (the issue's wording). unirank's workers end with their
  parent (PR_SET_PDEATHSIG); torchrun's train on.

A launcher that shows no restarted step within :data:`BOUND_S` counts as "did not restart
within N s" and its ratio is printed as a bound. Slurm's requeue path is shown beside it, from
docs/run.md's measurement on the testbed (not measured here: about two minutes per run).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from _pss import descendants

HERE = Path(__file__).resolve().parent
PY = sys.executable
WORKER = str(HERE / "_elastic_worker.py")
NODE_A, NODE_B = "127.0.1.1", "127.0.1.2"
#: the rendezvous settings of both launchers (torchrun's keys and meaning)
CONF = "join_timeout=60,last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3"
#: seconds after the kill before a launcher counts as not restarting
BOUND_S = 60.0
#: Slurm's requeue path on the testbed (docs/run.md, ../shared/slurm-testbed.md): Slurm holds a
#: requeued job about 120 s before it may start again, then the job starts anew
SLURM_REQUEUE_S = 125.0
STEPS = 2000
_STEP = re.compile(r"^step \d+ rank \d+ world (\d+) restart (\d+) at ([\d.]+)$", re.MULTILINE)


def _env() -> dict[str, str]:
    prefixes = ("SLURM", "OMPI", "PMI", "PMIX", "RANK", "LOCAL_", "WORLD_SIZE", "GROUP_",
                "MASTER_", "TORCHELASTIC", "UNIRANK")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((NODE_A, 0))
        return int(s.getsockname()[1])


def _launcher(name: str) -> list[str]:
    return ([PY, "-m", "unirank", "run"] if name == "unirank"
            else [PY, "-m", "torch.distributed.run"])


def _node(name: str, port: int, addr: str, out: Path) -> subprocess.Popen[bytes]:
    cmd = [*_launcher(name), "--nnodes", "1:2", "--nproc-per-node", "2", "--max-restarts", "3",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{NODE_A}:{port}", "--rdzv-id",
           "bench", "--rdzv-conf", CONF, "--local-addr", addr, WORKER, str(STEPS)]
    with open(out, "wb") as sink:
        return subprocess.Popen(cmd, env=_env(), stdout=sink, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _until(check: object, timeout: float, what: str) -> None:
    """Poll ``check()`` every 50 ms until it is true; a RuntimeError naming ``what`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"elastic: {what} within {timeout:g} s")
        time.sleep(0.05)


def _listens(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((NODE_A, port)) == 0


def _tree(proc: subprocess.Popen[bytes]) -> list[int]:
    return [proc.pid, *sorted(descendants(proc.pid))]


def _end(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        for pid in _tree(proc) if proc.poll() is None else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _world_of_four(name: str, folder: Path, tries: int = 3,
                   ) -> tuple[list[subprocess.Popen[bytes]], Path]:
    """Nodes A and B started (B once A's store listens) and training at a world of 4, their
    processes and A's output; a try where B came after the last call and the world of 4 did
    not form within 45 s is ended and started again."""
    for attempt in range(tries):
        port = _free_port()
        out_a = folder / f"{name}-{attempt}-a.log"
        procs = [_node(name, port, NODE_A, out_a)]
        try:
            _until(lambda port=port: _listens(port), 60,  # type: ignore[misc]
                   f"{name}: node A's store did not listen")
            procs.append(_node(name, port, NODE_B, folder / f"{name}-{attempt}-b.log"))
            _until(lambda out=out_a: "step 3 rank 0 world 4 " in out.read_text(),  # type: ignore[misc]
                   45, "")
            return procs, out_a
        except RuntimeError:
            _end(procs)
        except BaseException:
            _end(procs)
            raise
    raise RuntimeError(f"elastic: {name}: no world of 4 trained in {tries} tries")


def one_run(name: str, how: str, folder: Path) -> float | None:
    """Seconds from B's kill to node A's first restarted step; None when there was none
    within :data:`BOUND_S` (node A's launcher may have ended first: :data:`ENDED` says)."""
    procs, out_a = _world_of_four(name, folder)
    node_a = procs[0]
    try:
        victims = _tree(procs[1]) if how == "node" else [procs[1].pid]
        # a late node B may have joined at a restart already: count the restarts after this
        attempt = max(int(m[1]) for m in _STEP.findall(out_a.read_text()))
        killed = time.time()
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        found: list[float] = []

        def restarted() -> bool:
            found.extend([float(m[2]) for m in _STEP.findall(out_a.read_text())
                          if int(m[1]) > attempt][:1])
            return bool(found) or node_a.poll() is not None

        with contextlib.suppress(RuntimeError):
            _until(restarted, BOUND_S, "")
        if not found and node_a.poll() is not None:
            ENDED.append(f"{name}: node A ended with exit code {node_a.returncode} "
                         "without a restarted step")
        return found[0] - killed if found else None
    finally:
        _end(procs)


#: why a run had no restarted step, when node A's launcher ended first
ENDED: list[str] = []


def _median(times: list[float | None]) -> float | None:
    """The median, a run without a restart counting as the longest; None when that is it."""
    value = statistics.median(float("inf") if t is None else t for t in times)
    return None if value == float("inf") else value


def _shown(times: list[float | None]) -> str:
    runs = ", ".join("none" if t is None else f"{t:.1f}" for t in times)
    median = _median(times)
    head = (f"did not restart within {BOUND_S:g} s" if median is None
            else f"{median:.2f} s")
    return f"{head} (runs: {runs}; none: no restarted step within {BOUND_S:g} s)" \
        if None in times else f"{head} (runs: {runs})"


def bench_elastic(repeat: int) -> bool:
    runs = max(1, min(repeat, 3))
    times: dict[tuple[str, str], list[float | None]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(runs):
            for how in ("node", "launcher"):
                for name in ("unirank", "torchrun"):
                    times.setdefault((name, how), []).append(one_run(name, how, Path(tmp)))
    print(f"elastic: node B's SIGKILL to node A's first restarted step, --nnodes 1:2 "
          f"--max-restarts 3, 2 workers per node, --rdzv-conf {CONF} (medians of {runs})")
    for how, what in (("node", "node B's launcher and all its processes killed (a lost "
                               "machine)"),
                      ("launcher", "node B's launcher alone killed")):
        print(f"  {what}:")
        for name in ("unirank", "torchrun"):
            print(f"    {name + (' run' if name == 'unirank' else ''):<12} "
                  f"{_shown(times[(name, how)])}")
    for line in dict.fromkeys(ENDED):
        print(f"  ({line})")
    print(f"  Slurm's requeue path (docs/run.md, measured on the testbed): about "
          f"{SLURM_REQUEUE_S:g} s to the job's start again, before its first step")
    ours, theirs = _median(times[("unirank", "node")]), _median(times[("torchrun", "node")])
    label = "lost node: unirank run / torchrun"
    if ours is None:
        print(f"  {label:<52} unirank did not restart  target <= 0.5x  MISS")
        return False
    if theirs is None:
        ratio, bound = ours / BOUND_S, "<"
    else:
        ratio, bound = ours / theirs, ""
    ok = ratio <= 0.5
    print(f"  {label:<52} {bound}{ratio:7.3f}x  target <= 0.5x  {'OK' if ok else 'MISS'}")
    fast = ours <= 15.0
    print(f"  {'lost node: unirank run, kill to first step':<52} {ours:8.2f}s  target <= 15s  "
          f"{'OK' if fast else 'MISS'}")
    print(f"  {'lost node: unirank run / Slurm requeue':<52} {ours / SLURM_REQUEUE_S:8.3f}x  "
          "(no target)")
    return ok and fast
