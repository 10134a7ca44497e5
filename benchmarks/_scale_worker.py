"""Helper processes of benchmarks/scale.py (not a benchmark by itself).

    python3 _scale_worker.py server HOST TIMEOUT_S
        Hosts the one libuv TCPStore server, prints {"port": P, "pid": ...}, and serves until its
        stdin closes or TIMEOUT_S pass.
    rank_process(config, conn)  (run in a process forked by the benchmark's forkserver)
        Simulates the ranks [start, stop) of a world of N: one thread and one TCPStore client
        each. Sends {"ready": ...} once every client is connected; then for each step i of
        config["steps"] ([rep, phase]) its threads wait (each on its own client) for the key
        ``gate/<i>``, which the benchmark sets, run the phase, and the process sends
        {"step": i, ...} with the first and last start, the last end and the store calls made.

Phases, each under its own key prefix ``r<rep>/<phase>/`` so repetitions start from fresh keys:

``join``   ``unirank.joincheck.announce_and_wait`` (the unirank installed, i.e. src/).
``mesh``   the store traffic of torch 2.13's default ``init_process_group("gloo")`` with
           ``init_method="env://"`` (no torchelastic agent store), as read in distributed_c10d.py
           / rendezvous.py and traced through a counting ``dist.Store`` subclass:
           rendezvous: ``TCPStore(world_size=N, wait_for_workers=True)`` -> ``add("init/", 1)``
           on every rank, rank 0 polls ``get("init/")`` every 10 ms until it reads N;
           store-based barrier: off (TORCH_DIST_INIT_BARRIER=0 default);
           gloo (TORCH_GLOO_LAZY_INIT unset = full mesh): ``set`` of the rank's addresses
           (154 + 8 N bytes) at ``default_pg/0//cpu//0/<rank>``, then for every rank i, itself
           included: ``wait([key_i])`` and ``get(key_i)``.
``lazy``   torch with TORCH_GLOO_LAZY_INIT=1 plus its first ring all_reduce (traced likewise):
           the same rendezvous, ``set`` of a 154-byte address, then ``wait`` + ``get`` of the
           right and left neighbours' keys. Not torch's default: the stand-in used where the
           full mesh is too slow to simulate (it is O(N) store calls per rank, O(N^2) in all).

Connecting (connect, validate, ping) happens before the timed steps, for both flows alike.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import sys
import threading
import time
import traceback
from collections import Counter
from datetime import timedelta
from typing import Any

import unirank.joincheck as joincheck

#: the joincheck these processes run (the benchmark's forkserver imports this module once)
JOINCHECK_PATH = joincheck.__file__
with open(JOINCHECK_PATH, "rb") as _fh:
    JOINCHECK_SHA = hashlib.sha256(_fh.read()).hexdigest()[:12]
_LIST_ARG = {"wait", "check", "multi_get", "multi_set"}


class CountingStore:
    """Forwards to a store and counts, per method, the calls and the keys they name."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.calls: Counter[str] = Counter()
        self.keys: Counter[str] = Counter()

    def _count(self, name: str, key_arg: Any) -> None:
        self.calls[name] += 1
        if name in _LIST_ARG:
            self.keys[name] += len(key_arg)
        elif key_arg is not None:
            self.keys[name] += 1

    def set(self, key: str, value: Any) -> Any:
        self._count("set", key)
        return self._store.set(key, value)

    def get(self, key: str) -> Any:
        self._count("get", key)
        return self._store.get(key)

    def add(self, key: str, amount: int) -> Any:
        self._count("add", key)
        return self._store.add(key, amount)

    def check(self, keys: list[str]) -> Any:
        self._count("check", keys)
        return self._store.check(keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> Any:
        self._count("wait", keys)
        if timeout is None:
            return self._store.wait(keys)
        return self._store.wait(keys, timeout)

    def __getattr__(self, name: str) -> Any:  # any other store method: counted, one key or none
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._count(name, args[0] if args else None)
            return attr(*args, **kwargs)

        return counted


def _rendezvous(store: CountingStore, rank: int, world: int, deadline: float) -> None:
    """env:// rendezvous: TCPStore(world_size=N)'s waitForWorkers."""
    store.add("init/", 1)
    if rank == 0:  # the master's constructor polls until every worker has counted itself
        while int(store.get("init/")) < world:
            if time.monotonic() > deadline:
                raise TimeoutError("rendezvous: not every rank counted itself in init/")
            time.sleep(0.010)


def _gloo_key(rank: int) -> str:
    return f"default_pg/0//cpu//0/{rank}"


def phase_mesh(store: CountingStore, rank: int, world: int, deadline: float) -> None:
    _rendezvous(store, rank, world, deadline)
    store.set(_gloo_key(rank), b"a" * (154 + 8 * world))
    for peer in range(world):
        key = _gloo_key(peer)
        store.wait([key], timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
        store.get(key)


def phase_lazy(store: CountingStore, rank: int, world: int, deadline: float) -> None:
    _rendezvous(store, rank, world, deadline)
    store.set(_gloo_key(rank), b"a" * 154)
    for peer in sorted({(rank + 1) % world, (rank - 1) % world} - {rank}):
        key = _gloo_key(peer)
        store.wait([key], timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
        store.get(key)


def serve(host: str, timeout: float) -> int:
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    server = TCPStore(host, 0, None, True, timedelta(seconds=timeout), wait_for_workers=False,
                      use_libuv=True)
    print(json.dumps({"port": server.port, "pid": os.getpid()}), flush=True)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ready, _, _ = select.select([sys.stdin], [], [], min(5.0, end - time.monotonic()))
        if ready and not sys.stdin.buffer.readline():
            break  # stdin closed: the benchmark is done with this N
    os._exit(0)  # do not wait for the store's clients to go


def rank_process(cfg: dict[str, Any], conn: Any) -> None:
    """Entry of a rank process (forked by the benchmark's forkserver; ``conn`` a Pipe end)."""
    try:
        _run_ranks(cfg, conn)
    except Exception:  # the benchmark shows it
        conn.send({"fatal": traceback.format_exc()[-2000:]})
    finally:
        os._exit(0)  # the clients' sockets go with the process, no atexit work


def _run_ranks(cfg: dict[str, Any], conn: Any) -> None:
    from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]

    threading.stack_size(256 * 1024)
    # Thousands of threads wake at once (the start gate, the join's last key): with the default
    # 5 ms switch interval every GIL waiter wakes every 5 ms to demand the GIL, and that storm,
    # not the store, takes seconds (16K ranks: 12 s instead of 0.6 s after the last start).
    sys.setswitchinterval(float(cfg["switch_interval"]))
    host, port, world = cfg["host"], cfg["port"], cfg["world"]
    start, stop = cfg["ranks"]
    timeout = float(cfg["timeout"])
    steps: list[list[Any]] = cfg["steps"]
    end_of_run = time.monotonic() + float(cfg["deadline"])

    t0 = time.monotonic()
    clients = [TCPStore(host, port, None, False, timedelta(seconds=timeout),
                        wait_for_workers=False) for _ in range(start, stop)]
    connect_s = time.monotonic() - t0
    count = stop - start
    done = [threading.Event() for _ in steps]
    left = [count] * len(steps)
    lock = threading.Lock()
    results: list[list[Any]] = [[] for _ in steps]

    def rank_main(rank: int, client: Any) -> None:
        for i, (rep, phase) in enumerate(steps):
            row: list[Any] = [rank, None, None, {}, {}, None]
            store = CountingStore(PrefixStore(f"r{rep}/{phase}", client))
            try:  # the start gate: every rank waits for the benchmark's key, uncounted
                client.wait([f"gate/{i}"],
                            timedelta(seconds=max(end_of_run - time.monotonic(), 0.001)))
                released = True
            except Exception:  # timed out: the run deadline
                released = False
            if released:
                row[1] = time.monotonic()
                deadline = row[1] + timeout
                try:
                    if phase == "join":
                        joincheck.announce_and_wait(store, rank=rank, world_size=world,
                                                    node_name=f"n{rank // 8}", timeout=timeout)
                    elif phase == "mesh":
                        phase_mesh(store, rank, world, deadline)
                    elif phase == "lazy":
                        phase_lazy(store, rank, world, deadline)
                    else:
                        raise ValueError(f"unknown phase {phase}")
                except Exception as exc:  # reported, counted as a failure
                    row[5] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
                row[2] = time.monotonic()
                row[3], row[4] = dict(store.calls), dict(store.keys)
            else:
                row[5] = "never released (run deadline)"
            with lock:
                results[i].append(row)
                left[i] -= 1
                if left[i] == 0:
                    done[i].set()

    threads = [threading.Thread(target=rank_main, args=(start + j, c), daemon=True)
               for j, c in enumerate(clients)]
    for thread in threads:
        thread.start()
    conn.send({"ready": True, "joincheck": JOINCHECK_PATH, "joincheck_sha": JOINCHECK_SHA,
               "connect_s": connect_s, "pid": os.getpid()})

    for i in range(len(steps)):
        if not done[i].wait(max(end_of_run - time.monotonic(), 0.0)):
            conn.send({"fatal": f"step {i}: {left[i]} of {count} ranks still running at the "
                       "run deadline"})
            return
        conn.send({"step": i, **_summarise(results[i])})


def _summarise(rows: list[list[Any]]) -> dict[str, Any]:
    starts = [r[1] for r in rows if r[1] is not None]
    ends = [r[2] for r in rows if r[2] is not None]
    calls: Counter[str] = Counter()
    keys: Counter[str] = Counter()
    per_rank_calls, per_rank_keys = [], []
    for row in rows:
        calls.update(row[3])
        keys.update(row[4])
        per_rank_calls.append(sum(row[3].values()))
        per_rank_keys.append(sum(row[4].values()))
    errors = [f"rank {r[0]}: {r[5]}" for r in rows if r[5]]
    return {
        "ranks": len(rows),
        "first_start": min(starts) if starts else None,
        "last_start": max(starts) if starts else None,
        "last_end": max(ends) if ends else None,
        "calls": dict(calls),
        "keys": dict(keys),
        "max_calls": max(per_rank_calls, default=0),
        "max_keys": max(per_rank_keys, default=0),
        "errors": len(errors),
        "first_errors": errors[:3],
    }


def main() -> int:
    if sys.argv[1] == "server":
        return serve(sys.argv[2], float(sys.argv[3]))
    raise SystemExit(f"unknown mode {sys.argv[1]!r}")


if __name__ == "__main__":
    sys.exit(main())
