"""The init watchdog against a real torch TCPStore: ranks are threads of this process, each with its
own store client, as they would be separate processes."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from unirank.joincheck import (
    JOIN_PREFIX,
    RESULT_KEY,
    InitTimeoutError,
    announce_and_wait,
    format_ranks,
    join_key,
)

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


def _run_ranks(server: Any, ranks: list[int], world_size: int, timeout: float,
               log: list[tuple[int, str, Any, str]] | None = None
               ) -> dict[int, BaseException | None]:
    """Run announce_and_wait for ``ranks`` in threads; returns each rank's exception or None.
    With ``log``, each rank's store calls are recorded there (see :class:`_Recorder`)."""
    results: dict[int, BaseException | None] = {}

    def one(rank: int) -> None:
        try:
            store = _client(server)
            if log is not None:
                store = _Recorder(store, rank, log)
            announce_and_wait(store, rank=rank, world_size=world_size,
                              node_name=NODES[rank], timeout=timeout, rank_to_node=NODES.get)
            results[rank] = None
        except BaseException as exc:
            results[rank] = exc

    threads = [threading.Thread(target=one, args=(r,)) for r in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout + 60)
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
    assert waits[0][0] == tuple(join_key(r) for r in range(4)) and waits[0][1] != "ok"
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
