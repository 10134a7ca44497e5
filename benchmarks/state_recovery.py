"""Recovery with state, measured: ``python3 benchmarks/state_recovery.py [--mib 256 1024]
[--tiers memory disk memory-only dcp dcp-async] [--spare] [--netns]``.

Two nodes of an elastic job on one host (``unirank run --nnodes 1:2 --rdzv-backend c10d``,
the same command twice, default settings) train a model of N MiB in all, sharded over the two
ranks (``benchmarks/_state_worker.py``: a DTensor), one step a second, ``ur.save_state`` every
step. Once both ran :data:`KILL_AFTER` steps, one node's whole process tree is killed (the
serving node's). The survivor's world of 1 restores and trains on; then the killed node is
started again (the same command) and the world of 2 restores and trains on. Printed, per N and
per tier: the time a save blocks the loop (median; the ``save_state`` call and the next
optimizer step's wait for it), the restore's seconds and the bytes the worker read from
storage meanwhile (``/proc/self/io``; the disk folder's files are evicted from the page cache
first), the time from the kill to the survivor's first step with its state, whether that state
is the newest step saved, and the time from the killed node's new start to the world of 2's
first step with the state (and the bytes its ranks read from storage). Tiers, side by side in
one run: ``memory`` (unirank's: the node's memory and a copy in the peer's), ``disk``
(``--state-budget 0``: unirank's snapshot to the disk folder each step), ``memory-only`` (a
node-memory tier as DLRover's flash checkpoint keeps one: the program saves each step with
``dcp.save`` into its node's memory and persists it to the disk folder in a thread; no copy on
another node, so the killed node's memory is gone with it and the restore reads its part from
the disk), ``dcp`` and ``dcp-async`` (a program that saves with torch's ``dcp.save`` or
``dcp.async_save`` to local disk each step, and loads the newest complete step with
``dcp.load``; under ``unirank run`` too, whose snapshot memory these three do not use).
``--spare`` adds, per N, the memory tier with a spare: a third node (the same command) waits
warm while the two train at MAX; the serving node is killed and the spare takes its place:
the time from the kill to the first step of the new world of 2 with its state, and what the
spare's rank read from storage (its part comes from the survivor's memory, where its copy
was). ``--netns`` (root) runs each tier a second time on three nodes in network namespaces of
their own (tests/integration/_netns.py: one address each, joined by a bridge; ``--nnodes 2:3``):
the serving node killed, the two others train on at world 2, the killed node started again
brings the world back to 3; the same columns.
Environment variables read: none.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _pss import descendants

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "integration")]
from _netns import IFNAME, Net, address  # noqa: E402

WORKER = ROOT / "benchmarks" / "_state_worker.py"
STEPS = 22
#: the step after which the serving node is killed: the memory tier past its first saves (the
#: first three take their pages from the system; from then on a save writes over a dropped one)
KILL_AFTER = 8
#: the tiers whose program saves with torch's DCP itself (``benchmarks/_state_worker.py``)
TORCH_TIERS = ("dcp", "dcp-async")
#: the tiers the program keeps itself (unirank's are ``memory`` and ``disk``)
PROGRAM_TIERS = ("memory-only", *TORCH_TIERS)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _records(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def _drop_cached(folder: Path) -> None:
    """Evict the disk folder's files from the page cache (a restore then reads them from
    storage), and nothing else: the processes' own pages stay as they were."""
    for top, _, names in os.walk(folder):  # the workers write on: a file may go meanwhile
        for name in names:
            with contextlib.suppress(OSError):
                fd = os.open(os.path.join(top, name), os.O_RDONLY)
                try:
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def _node(args: list[str], env: dict[str, str], out: Path, net: Net | None = None,
          node: int = 1) -> subprocess.Popen[bytes]:
    """Start a node's ``unirank run`` (in node ``node``'s namespace of ``net``)."""
    prefix: list[str] = []
    if net is not None:  # the node's own name and address, gloo on its own interface (the
        # namespaces share the host's name, which resolves to none of their addresses), as
        # tests/integration/faults/runner.py gives them
        prefix = net.prefix(node)
        env = {**env, "UNIRANK_NODE_NAME": f"node{node}", "GLOO_SOCKET_IFNAME": IFNAME}
        args = ["--local-addr", address(node), *args]
    return subprocess.Popen([*prefix, sys.executable, "-m", "unirank", "run", *args], env=env,
                            stdout=out.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def run_case(mib: int, tier: str, folder: Path, net: Net | None = None) -> dict[str, Any]:
    """One job: two nodes on loopback (three in ``net``'s namespaces), the serving one killed
    after :data:`KILL_AFTER` and started again once the others stepped; what the survivors
    and the whole world again saw."""
    log, disk = folder / "log.jsonl", folder / "disk"
    nodes = len(net.nodes) if net is not None else 2
    extra = ["--state-budget", "0"] if tier == "disk" else []
    endpoint = f"{address(1)}:29400" if net is not None else f"127.0.0.1:{_free_port()}"
    args = [*extra, *_job_args(mib, log, disk, tier if tier in PROGRAM_TIERS else "unirank",
                               endpoint, f"{nodes - 1}:{nodes}")]
    memory = Path(tempfile.mkdtemp(prefix="state-bench-", dir="/dev/shm"))
    try:
        first = _node(args, _node_env(memory / "n1"), folder / "n1.out", net, 1)
        time.sleep(1.0)  # the endpoint's node first, as a user starts them
        others = [_node(args, _node_env(memory / f"n{n}"), folder / f"n{n}.out", net, n)
                  for n in range(2, nodes + 1)]
        _await(log, lambda r: r.get("step") == KILL_AFTER and r["world"] == nodes, first,
               folder)
        _drop_cached(disk)
        killed = time.time()
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=60)
        shutil.rmtree(memory / "n1")  # memory-only: the lost machine's memory went with it
        _await(log, lambda r: "stepped" in r and r["world"] == nodes - 1, others[0], folder)
        _drop_cached(disk)  # what the node started again reads from the disk, it reads there
        # the killed node started again, its memory empty
        again = _node(args, _node_env(memory / "again"), folder / "again.out", net, 1)
        started = time.time()
        for node in (*others, again):
            node.wait(timeout=300)
    finally:
        shutil.rmtree(memory, ignore_errors=True)
    return _row(mib, tier, _records(log), killed, started, nodes)


def _job_args(mib: int, log: Path, disk: Path, mode: str, endpoint: str,
              nnodes: str = "1:2") -> list[str]:
    """``unirank run``'s arguments for a node of the job (the same on every node), the
    worker's ``mode`` (``benchmarks/_state_worker.py``)."""
    return ["--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", endpoint, str(WORKER), str(mib), str(STEPS), str(log), str(disk),
            mode]


def _node_env(memory: Path) -> dict[str, str]:
    """A node's environment: unirank from this checkout, the ``memory-only`` tier's memory."""
    memory.mkdir()
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "BENCH_NODE_MEMORY": str(memory)}


def run_spare_case(mib: int, folder: Path) -> dict[str, Any]:
    """Two nodes at MAX and a spare waiting warm; the serving node killed after
    :data:`KILL_AFTER`: what the new world of 2 (the survivor and the spare) saw."""
    log = folder / "log.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    args = _job_args(mib, log, folder / "disk", "unirank", f"127.0.0.1:{_free_port()}")
    first = _node(args, env, folder / "a.out")
    time.sleep(1.0)  # the endpoint's node first, as a user starts them
    second = _node(args, env, folder / "b.out")
    _await(log, lambda r: r.get("step") == 1 and r["world"] == 2, first, folder)
    spare = _node(args, env, folder / "c.out")
    _await_warm(spare, folder)
    _await(log, lambda r: r.get("step") == KILL_AFTER and r["world"] == 2, first, folder)
    killed = time.time()
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=60)
    for node in (second, spare):
        node.wait(timeout=300)
    records = _records(log)
    restores = [r for r in records if "restored" in r and r["started"] > killed]
    if len(restores) != 2 or any(r["world"] != 2 for r in restores):
        raise SystemExit(f"the spare did not take the killed node's place: see {folder}")
    step = restores[0]["restored"]
    first_restore = records.index(restores[0])  # the new world's steps come after it
    after = min(r["stepped"] for r in records[first_restore:] if r.get("step") == step + 1)
    newest = max(r["step"] for r in records if "step" in r and r["time"] < killed)
    return {"kill_to_first_step_s": after - killed, "restored": step, "newest_saved": newest,
            "restore_s": max(r["load_s"] for r in restores),
            "read_bytes": max(r["read"] for r in restores),
            "kill_to_worker_s": max(r["started"] for r in restores) - killed}


def _await_warm(spare: subprocess.Popen[bytes], folder: Path) -> None:
    """Until the spare waits to join with torch imported in its fork server."""
    deadline = time.monotonic() + 300
    while not _torch_in_tree(spare.pid):
        if time.monotonic() > deadline or spare.poll() is not None:
            raise SystemExit(f"the spare never waited warm: see {folder}")
        time.sleep(0.05)  # polling its processes' mappings


def _torch_in_tree(root: int) -> bool:
    """Whether a process of ``root``'s tree has torch's library mapped."""
    for pid in (root, *descendants(root)):
        with contextlib.suppress(OSError):
            if "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text():
                return True
    return False


def _await(log: Path, seen: Any, node: subprocess.Popen[bytes], folder: Path) -> None:
    """Until a record of ``log`` is ``seen``."""
    deadline = time.monotonic() + 300
    while not any(seen(r) for r in _records(log)):
        if time.monotonic() > deadline or node.poll() is not None:
            raise SystemExit(f"the job never got there: see {folder}")
        time.sleep(0.05)  # polling a file the workers append to


def _row(mib: int, tier: str, records: list[dict[str, Any]], killed: float,
         started: float, nodes: int) -> dict[str, Any]:
    """What the survivors (a world of ``nodes - 1``) and the node started again saw."""
    # a step is blocked by its save_state call and by its optimizer's wait for the save before
    saves = [r["save_s"] + r.get("wait_s", 0.0) for r in records
             if "save_s" in r and r["world"] == nodes]
    restores = [r for r in records if "restored" in r and r["world"] == nodes - 1]
    restore = restores[0]
    after = next(r for r in records if r.get("step") == restore["restored"] + 1
                 and r["world"] == nodes - 1)
    newest = max(r["step"] for r in records if "step" in r and r["world"] == nodes
                 and r["time"] < killed)
    return {"mib": mib, "tier": tier, "save_block_s": statistics.median(saves),
            "restore_s": max(r["load_s"] for r in restores),
            "read_bytes": max(r["read"] for r in restores),
            "kill_to_first_step_s": after["stepped"] - killed,
            "kill_to_worker_s": max(r["started"] for r in restores) - killed,
            "kill_to_group_s": max(r["grouped"] for r in restores) - killed,
            "restored": restore["restored"],
            "newest_saved": newest, "whole": after["value"] == restore["restored"] + 2,
            "source": restore["source"], **_back(records, started, nodes)}


def _back(records: list[dict[str, Any]], started: float, nodes: int) -> dict[str, Any]:
    """The world of ``nodes`` again after the killed node started again: the time from its
    start to its first step with its state, what its ranks read from storage, from where."""
    restores = [r for r in records if "restored" in r and r["world"] == nodes
                and r["started"] > started]
    if not restores:
        raise SystemExit(f"the node started again never trained at world {nodes}")
    step = restores[0]["restored"]
    back = min(r["stepped"] for r in records if r.get("step") == step + 1
               and r["world"] == nodes and r["time"] > started)
    return {"back_s": back - started, "back_read_bytes": max(r["read"] for r in restores),
            "back_source": restores[0]["source"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--tiers", nargs="*", default=["memory", "disk", *PROGRAM_TIERS],
                        choices=["memory", "disk", *PROGRAM_TIERS])
    parser.add_argument("--spare", action="store_true", help="also: the memory tier with a spare")
    parser.add_argument("--netns", action="store_true",
                        help="also: each tier on 3 nodes in network namespaces (root)")
    args = parser.parse_args()
    print(f"{'state':>8} {'tier':>11} {'save blocks':>12} {'restore':>8} {'read':>10} "
          f"{'kill->worker':>13} {'kill->step':>11} {'restored/newest':>16} "
          f"{'start->whole':>13} {'read':>10}")
    for mib in args.mib:
        for tier in args.tiers:
            _print(mib, tier, _case(mib, tier, None))
            if args.netns:
                with Net(3) as net:
                    _print(mib, f"{tier} x3", _case(mib, tier, net))
        if args.spare:
            with tempfile.TemporaryDirectory(prefix="state-bench-") as folder:
                spare = run_spare_case(mib, Path(folder))
            print(f"{mib:>5} MiB {'+ spare':>11} {'':>12} {spare['restore_s']:>6.2f} s "
                  f"{spare['read_bytes'] / (1 << 20):>6.1f} MiB "
                  f"{spare['kill_to_worker_s']:>11.2f} s "
                  f"{spare['kill_to_first_step_s']:>9.2f} s "
                  f"{spare['restored']:>7}/{spare['newest_saved']:<8}", flush=True)


def _case(mib: int, tier: str, net: Net | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="state-bench-") as folder:
        return run_case(mib, tier, Path(folder), net)


def _print(mib: int, label: str, row: dict[str, Any]) -> None:
    print(f"{mib:>5} MiB {label:>11} {row['save_block_s']:>10.3f} s "
          f"{row['restore_s']:>6.2f} s {row['read_bytes'] / (1 << 20):>6.1f} MiB "
          f"{row['kill_to_worker_s']:>11.2f} s {row['kill_to_first_step_s']:>9.2f} s "
          f"{row['restored']:>7}/{row['newest_saved']:<8} {row['back_s']:>11.2f} s "
          f"{row['back_read_bytes'] / (1 << 20):>6.1f} MiB", flush=True)


if __name__ == "__main__":
    main()
