"""The init watchdog against a real torch TCPStore: ranks are threads of this process, each with its
own store client, as they would be separate processes.

The tests of how many store calls each rank makes at 64, 256 and 1,024 ranks use
:class:`_MemoryStore`, an in-memory store with torch's semantics, instead: 1,024 TCPStore clients
in one process are slow to open (each connection can stall on this machine's name look-up of
``::ffff:127.0.0.1``), and what is measured is the calls and keys each rank names, which do not
depend on the transport. One real-store test checks the same profile through torch's client."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from unirank.joincheck import (
    ALL_KEY,
    COORDINATOR_KEY,
    COUNT_KEY,
    JOIN_PREFIX,
    RESULT_KEY,
    InitTimeoutError,
    JoinAbortedError,
    abort_join,
    announce_and_wait,
    format_ranks,
    join_key,
)
from unirank.storekeys.init import init_prefix

torch_dist = pytest.importorskip("torch.distributed")

NODES = {0: "nodeA", 1: "nodeA", 2: "nodeC", 3: "nodeC"}


@pytest.fixture
def server() -> Iterator[Any]:
    store = torch_dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30),
                                wait_for_workers=False)
    yield store


def _client(server: Any) -> Any:
    return torch_dist.TCPStore("127.0.0.1", server.port, None, False, timedelta(seconds=30),
                               wait_for_workers=False)


class _Recorder:
    """A store client that records, per rank, the keys it sets and each wait's keys and outcome
    ("ok", or the name of the exception the wait raised)."""

    def __init__(self, store: Any, rank: int, log: list[tuple[int, str, Any, str]]) -> None:
        self._store = store
        self._rank = rank
        self._log = log

    def set(self, key: str, value: Any) -> Any:
        self._log.append((self._rank, "set", key, "ok"))
        return self._store.set(key, value)

    def wait(self, keys: list[str], timeout: timedelta) -> Any:
        try:
            result = self._store.wait(keys, timeout)
        except BaseException as exc:
            self._log.append((self._rank, "wait", tuple(keys), type(exc).__name__))
            raise
        self._log.append((self._rank, "wait", tuple(keys), "ok"))
        return result

    def check(self, keys: list[str]) -> bool:
        return bool(self._store.check(keys))

    def get(self, key: str) -> Any:
        return self._store.get(key)

    def add(self, key: str, value: int) -> int:
        return int(self._store.add(key, value))


def _run_ranks(server: Any, ranks: list[int], world_size: int, timeout: float,
               log: list[tuple[int, str, Any, str]] | None = None
               ) -> dict[int, BaseException | None]:
    """Run announce_and_wait for ``ranks`` in threads; returns each rank's exception or None.
    With ``log``, each rank's store calls are recorded there (see :class:`_Recorder`)."""

    def store_for(rank: int) -> Any:
        store = _client(server)
        return store if log is None else _Recorder(store, rank, log)

    return _run_threads(store_for, ranks, world_size, timeout, NODES.get)


def _run_threads(store_for: Callable[[int], Any], ranks: list[int], world_size: int,
                 timeout: float, rank_to_node: Callable[[int], str | None]
                 ) -> dict[int, BaseException | None]:
    """Run announce_and_wait for ``ranks`` in threads, rank ``r`` on ``store_for(r)``.

    Every thread opens its store first and then waits at a barrier, so that no rank's clock
    starts while another is still connecting. Returns each rank's exception or None.
    """
    results: dict[int, BaseException | None] = {}
    barrier = threading.Barrier(len(ranks))

    def one(rank: int) -> None:
        try:
            store = store_for(rank)
            barrier.wait(timeout=120)
            announce_and_wait(store, rank=rank, world_size=world_size,
                              node_name=rank_to_node(rank) or "", timeout=timeout,
                              rank_to_node=rank_to_node)
            results[rank] = None
        except BaseException as exc:
            results[rank] = exc

    threads = [threading.Thread(target=one, args=(r,)) for r in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout + 120)
        assert not thread.is_alive(), "announce_and_wait did not return"
    return results


def test_all_ranks_join(server: Any) -> None:
    results = _run_ranks(server, [0, 1, 2, 3], 4, timeout=30)
    assert results == {0: None, 1: None, 2: None, 3: None}
    assert not server.check([RESULT_KEY])
    assert server.get(join_key(2)) == b"nodeC"


def test_missing_rank_is_named_by_every_rank_that_started(server: Any) -> None:
    log: list[tuple[int, str, Any, str]] = []
    results = _run_ranks(server, [0, 1, 3], 4, timeout=2, log=log)
    for rank in (0, 1, 3):
        exc = results[rank]
        assert isinstance(exc, InitTimeoutError), exc
        assert exc.missing_ranks == [2]
        assert exc.nodes == {2: "nodeC"}
        message = str(exc)
        assert message.startswith(f"rank {rank}: init timeout: 1 of 4 ranks did not join")
        assert "within 2 s: rank 2 (on nodeC)." in message
        assert "--init-timeout" in message
        assert "\n" not in message
    # rank 0 published its verdict, each follower said it had read it (or looked for itself) ...
    seen = [f"{JOIN_PREFIX}seen/{rank}" for rank in (1, 3)]
    assert [key for rank, op, key, _ in log if rank == 0 and op == "set"] == [
        join_key(0), RESULT_KEY]
    for rank, key in zip((1, 3), seen):
        assert [k for r, op, k, _ in log if r == rank and op == "set"] == [join_key(rank), key]
    assert server.check(seen)
    # ... and rank 0 lingered on exactly those keys, and its wait ended because they came, not
    # because it ran out (its first wait, for the join keys, did run out)
    waits = [(keys, outcome) for rank, op, keys, outcome in log if rank == 0 and op == "wait"]
    assert len(waits) == 2
    assert waits[0][0] == (ALL_KEY,) and waits[0][1] != "ok"
    assert waits[1] == (tuple(seen), "ok")


def test_follower_without_rank_0_looks_for_itself(server: Any) -> None:
    results = _run_ranks(server, [1, 3], 4, timeout=1)
    for rank in (1, 3):
        exc = results[rank]
        assert isinstance(exc, InitTimeoutError), exc
        assert exc.missing_ranks == [0, 2]
        assert "2 of 4 ranks did not join within 1 s: rank 0 (on nodeA); rank 2 (on nodeC)." \
            in str(exc)


_HOST = """
import sys, datetime
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=30),
                      wait_for_workers=False)
print(store.port, flush=True)
sys.stdin.read()
"""


def test_lost_store_is_not_reported_as_a_timeout() -> None:
    host = subprocess.Popen([sys.executable, "-c", _HOST], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None
        port = int(host.stdout.readline())
        client = torch_dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=30),
                                     wait_for_workers=False)
        outcome: list[BaseException | None] = []

        def follower() -> None:
            try:
                announce_and_wait(client, rank=1, world_size=2, node_name="n", timeout=60)
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=follower)
        thread.start()
        watcher = torch_dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=30),
                                      wait_for_workers=False)
        watcher.wait([join_key(1)], timedelta(seconds=30))
        host.kill()  # the host goes away while rank 1 waits
        thread.join(timeout=50)
        assert not thread.is_alive()
        assert len(outcome) == 1
        assert isinstance(outcome[0], RuntimeError)
        assert not isinstance(outcome[0], InitTimeoutError)
    finally:
        host.kill()
        host.communicate(timeout=30)


@pytest.mark.parametrize(
    ("ranks", "text"),
    [([3], "rank 3"), ([0, 1, 2, 5, 7, 8, 9], "ranks 0-2, 5, 7-9"), ([2, 1], "ranks 1-2"),
     ([], "no ranks")],
)
def test_format_ranks(ranks: list[int], text: str) -> None:
    assert format_ranks(ranks) == text


def test_message_groups_ranks_by_node() -> None:
    nodes: dict[int, str | None] = {4: "b", 5: "b", 6: "b", 9: "c"}
    exc = InitTimeoutError([9, 4, 5, 6], world_size=12, timeout=300, nodes=nodes)
    assert "4 of 12 ranks did not join within 300 s: ranks 4-6 (on b); rank 9 (on c)." in str(exc)
    assert exc.missing_ranks == [4, 5, 6, 9]


def test_rank_outside_the_world_is_refused(server: Any) -> None:
    check: Callable[..., None] = announce_and_wait
    with pytest.raises(ValueError, match="outside the world"):
        check(server, rank=4, world_size=4, node_name="n", timeout=1)


class _StoreTimeout(RuntimeError):
    """What :class:`_MemoryStore`'s ``wait`` raises when it runs out (torch raises
    ``DistStoreError``, also a ``RuntimeError``)."""


class _MemoryStore:
    """An in-memory store shared by threads, with torch's semantics for the calls the watchdog
    makes: values come back as bytes, ``add`` returns the new count, ``wait`` blocks until every
    key is set or raises at its timeout, ``get`` blocks until the key is set. Each key has a
    ``threading.Event`` that ``set`` and ``add`` raise, so a ``wait`` of a thousand threads on one
    key wakes them once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, bytes] = {}
        self._events: dict[str, threading.Event] = {}

    def _event(self, key: str) -> threading.Event:
        with self._lock:
            return self._events.setdefault(key, threading.Event())

    def set(self, key: str, value: Any) -> None:
        data = value if isinstance(value, bytes) else str(value).encode()
        with self._lock:
            self._data[key] = data
        self._event(key).set()

    def add(self, key: str, value: int) -> int:
        with self._lock:
            count = int(self._data.get(key, b"0")) + value
            self._data[key] = str(count).encode()
        self._event(key).set()
        return count

    def check(self, keys: list[str]) -> bool:
        with self._lock:
            return all(key in self._data for key in keys)

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        deadline = time.monotonic() + timeout.total_seconds()
        for key in keys:
            if not self._event(key).wait(max(0.0, deadline - time.monotonic())):
                raise _StoreTimeout(f"wait timeout after {timeout}, keys: {keys}")

    def get(self, key: str) -> bytes:
        self.wait([key], timedelta(seconds=30))
        with self._lock:
            return self._data[key]


#: one rank's store calls: (operation, the keys it named)
Calls = list[tuple[str, tuple[str, ...]]]


class _Counting:
    """Wraps a store for one rank and records each call it makes and the keys the call names."""

    def __init__(self, store: Any, calls: Calls) -> None:
        self._store = store
        self.calls = calls

    def set(self, key: str, value: Any) -> Any:
        self.calls.append(("set", (key,)))
        return self._store.set(key, value)

    def add(self, key: str, value: int) -> int:
        self.calls.append(("add", (key,)))
        return int(self._store.add(key, value))

    def check(self, keys: list[str]) -> bool:
        self.calls.append(("check", tuple(keys)))
        return bool(self._store.check(keys))

    def wait(self, keys: list[str], timeout: timedelta) -> Any:
        self.calls.append(("wait", tuple(keys)))
        return self._store.wait(keys, timeout)

    def get(self, key: str) -> Any:
        self.calls.append(("get", (key,)))
        return self._store.get(key)


def _node_of(rank: int) -> str:
    return f"node{rank // 8}"


def _counted_run(store: Any, world_size: int, missing: set[int], timeout: float
                 ) -> tuple[dict[int, BaseException | None], dict[int, Calls]]:
    """Run the ranks not in ``missing`` on ``store``, each through its own :class:`_Counting`."""
    calls: dict[int, Calls] = {rank: [] for rank in range(world_size) if rank not in missing}
    results = _run_threads(lambda rank: _Counting(store, calls[rank]), sorted(calls),
                           world_size, timeout, _node_of)
    return results, calls


def _keys_named(calls: Calls) -> int:
    """The most keys one call named."""
    return max(len(keys) for _, keys in calls)


def _join_keys_checked(calls: Calls) -> int:
    """How many join keys (``unirank/join/<rank>``) this rank's ``check`` calls named."""
    return sum(1 for op, keys in calls if op == "check" for key in keys
               if key.removeprefix(JOIN_PREFIX).isdigit())


def _success_profile(world_size: int) -> tuple[set[int], int]:
    store = _MemoryStore()
    results, calls = _counted_run(store, world_size, set(), timeout=120)
    assert results == dict.fromkeys(range(world_size))
    assert store.check([ALL_KEY]) and not store.check([RESULT_KEY])
    assert store.get(COUNT_KEY) == str(world_size).encode()
    # every rank: set its key, count itself, wait for "all" and read it (a node that gave up
    # sets it too); the last one sets "all" instead
    sequences = sorted(tuple(op for op, _ in rank_calls) for rank_calls in calls.values())
    assert sequences == [("set", "add", "set")] + [("set", "add", "wait", "get")] * (
        world_size - 1)
    finals = [rank_calls[-1] for rank_calls in calls.values()]
    assert finals.count(("set", (ALL_KEY,))) == 1
    assert finals.count(("get", (ALL_KEY,))) == world_size - 1
    return {len(rank_calls) for rank_calls in calls.values()}, \
        max(_keys_named(rank_calls) for rank_calls in calls.values())


def test_success_costs_every_rank_the_same_few_calls_at_any_world_size() -> None:
    calls_64, keys_64 = _success_profile(64)
    calls_1024, keys_1024 = _success_profile(1024)
    assert calls_64 == calls_1024 == {3, 4}
    assert keys_64 == keys_1024 == 1


def test_success_on_a_real_store_costs_the_same(server: Any) -> None:
    calls: dict[int, Calls] = {rank: [] for rank in range(8)}
    prefixed = [torch_dist.PrefixStore("/attempt_0/join", _client(server)) for _ in range(8)]
    results = _run_threads(lambda rank: _Counting(prefixed[rank], calls[rank]), list(range(8)),
                           8, 30, _node_of)
    assert results == dict.fromkeys(range(8))
    assert {len(c) for c in calls.values()} == {3, 4}
    assert max(_keys_named(c) for c in calls.values()) == 1
    assert server.get(f"/attempt_0/join/{COUNT_KEY}") == b"8"


def test_failure_is_scanned_by_rank_0_alone() -> None:
    store = _MemoryStore()
    missing = {5, 100, 201}
    results, calls = _counted_run(store, 256, missing, timeout=1.5)
    for rank, exc in results.items():
        assert isinstance(exc, InitTimeoutError), (rank, exc)
        assert exc.missing_ranks == [5, 100, 201]
        assert exc.nodes == {5: "node0", 100: "node12", 201: "node25"}
        assert str(exc).startswith(f"rank {rank}: init timeout: 3 of 256 ranks did not join "
                                   "within 2 s: rank 5 (on node0); rank 100 (on node12); "
                                   "rank 201 (on node25).")
    # rank 0 checked every join key (a few of them more than once, bisecting) ...
    assert _join_keys_checked(calls[0]) >= 256
    # ... every other rank only whether rank 0 joined, in the same few calls of one key each
    followers = [rank_calls for rank, rank_calls in calls.items() if rank != 0]
    assert {_join_keys_checked(c) for c in followers} == {1}
    assert {_keys_named(c) for c in followers} == {1}
    assert {tuple(op for op, _ in c) for c in followers} == {
        ("set", "add", "wait", "check", "check", "wait", "get", "set")}
    assert not any(op == "add" and keys == (COORDINATOR_KEY,) for c in calls.values()
                   for op, keys in c)


def test_failure_without_rank_0_is_scanned_by_one_stand_in() -> None:
    store = _MemoryStore()
    missing = {0, 17, 255}
    results, calls = _counted_run(store, 256, missing, timeout=1.5)
    for rank, exc in results.items():
        assert isinstance(exc, InitTimeoutError), (rank, exc)
        assert exc.missing_ranks == [0, 17, 255]
        assert "3 of 256 ranks did not join within 2 s: rank 0 (on node0); rank 17 (on node2); " \
            "rank 255 (on node31)." in str(exc)
    checked = {rank: _join_keys_checked(c) for rank, c in calls.items()}
    scanners = [rank for rank, count in checked.items() if count > 1]
    assert len(scanners) == 1
    assert checked[scanners[0]] >= 256
    others = [c for rank, c in calls.items() if rank != scanners[0]]
    assert {_join_keys_checked(c) for c in others} == {1}
    assert {_keys_named(c) for c in others} == {1}
    assert {len(c) for c in others} == {10}
    assert store.get(COORDINATOR_KEY) == b"253"


def test_a_second_init_on_the_same_store_starts_afresh(server: Any) -> None:
    """The bootstrap's check on the raw store, then two inits under their own prefixes (as
    lifecycle.py's PrefixStore), the second with a rank missing: counts never mix."""
    assert _run_ranks(server, [0, 1, 2, 3], 4, timeout=30) == dict.fromkeys(range(4))
    for prefix, ranks in ((f"{init_prefix(0)}/join", [0, 1, 2, 3]),
                          (f"{init_prefix(1)}/join", [0, 1, 3])):
        clients = {rank: torch_dist.PrefixStore(prefix, _client(server)) for rank in ranks}
        results = _run_threads(clients.__getitem__, ranks, 4, 2, NODES.get)
        if len(ranks) == 4:
            assert results == dict.fromkeys(range(4))
            continue
        for rank in ranks:
            exc = results[rank]
            assert isinstance(exc, InitTimeoutError), exc
            assert exc.missing_ranks == [2]
            assert "1 of 4 ranks did not join within 2 s: rank 2 (on nodeC)." in str(exc)
    assert server.get(COUNT_KEY) == b"4"
    assert server.get(f"{init_prefix(1)}/join/{COUNT_KEY}") == b"3"


def test_a_node_giving_up_ends_every_waiting_rank_at_once(server: Any) -> None:
    """Ranks 0 and 1 of 4 wait with a 300 s init timeout; a node that gives up (as ``unirank
    run`` on a node that refused its layout does) ends both waits with its reason. The threads
    get 60 s: waiting out the timeout fails the test."""
    outcome: dict[int, BaseException | None] = {}

    def one(rank: int) -> None:
        try:
            announce_and_wait(_client(server), rank=rank, world_size=4, node_name="nodeA",
                              timeout=300)
            outcome[rank] = None
        except BaseException as exc:
            outcome[rank] = exc

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in (0, 1)]
    for thread in threads:
        thread.start()
    server.wait([join_key(0), join_key(1)], timedelta(seconds=60))
    abort_join(server, "node nodeC refused to start its workers:\n  --node-rank disagrees")
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive(), "a rank waited on after the abort"
    for rank in (0, 1):
        exc = outcome[rank]
        assert isinstance(exc, JoinAbortedError), exc
        assert exc.reason == "node nodeC refused to start its workers: --node-rank disagrees"
        assert str(exc) == (f"rank {rank}: the job was stopped before every rank joined: "
                            f"{exc.reason}")


def test_a_rank_arriving_after_the_abort_ends_at_once(server: Any) -> None:
    abort_join(server, "node nodeC refused")
    with pytest.raises(JoinAbortedError, match="node nodeC refused"):
        announce_and_wait(_client(server), rank=2, world_size=4, node_name="nodeC", timeout=300)


def test_a_wait_at_the_group_s_start_says_so() -> None:
    """At a group's start the missing ranks run but have not started it: the message says
    that, and what to look at, in one line."""
    message = str(InitTimeoutError([2], world_size=3, timeout=3.0, nodes={2: "vm"}, rank=0,
                                   group_start=True))
    assert message.startswith("rank 0: init timeout: 1 of 3 ranks did not start their process "
                              "group within 3 s: rank 2 (on vm). Check what those ranks do "
                              "before init_process_group / ur.init")
    assert message.endswith("or raise --init-timeout / UNIRANK_INIT_TIMEOUT.")
    unknown = str(InitTimeoutError([], world_size=3, timeout=3.0, group_start=True))
    assert "not every one of the 3 ranks started its process group within 3 s" in unknown
    assert "\n" not in message + unknown


_LATE_SIGNAL = """
import signal, sys, threading, time
from unirank.joincheck import _interruptible

main = threading.main_thread()
bystander_go = threading.Event()
bystander = threading.Thread(target=bystander_go.wait, daemon=True)  # does not block SIGINT
bystander.start()
store_wait = threading.Event()


def main_thread_asleep_in_the_wait():
    frame = sys._current_frames().get(main.ident)
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    if names[:1] != ["wait"] or "_interruptible" not in names:
        return False
    with open(f"/proc/self/task/{main.native_id}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "S"


def call():
    deadline = time.monotonic() + 20
    while not main_thread_asleep_in_the_wait():  # nothing tells when a thread sleeps
        assert time.monotonic() < deadline
        time.sleep(0.001)
    # Python's handler runs in the bystander; the sleeping main thread is not woken by it,
    # as with a signal that lands just before the main thread's sleep
    signal.pthread_kill(bystander.ident, signal.SIGINT)
    store_wait.wait(60)

try:
    _interruptible(call)
except KeyboardInterrupt:
    print("interrupted")
"""


def test_a_signal_the_main_thread_sleeps_through_still_interrupts_the_wait() -> None:
    """A SIGINT whose handler ran while the main thread was not in its wait's system call (the
    CI saw a rank go on waiting after SIGINT): staged by sending it to another thread while the
    main thread sleeps in the wait. Before, the wait slept on until the store wait ended."""
    proc = subprocess.run([sys.executable, "-c", _LATE_SIGNAL], capture_output=True, text=True,
                          timeout=50)
    assert proc.stdout == "interrupted\n", proc.stderr
