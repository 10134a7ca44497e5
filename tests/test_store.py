"""The rendezvous store (:mod:`unirank.store`): ``open_store``'s one error translation, on real
TCPStores on 127.0.0.1, and the one hand-over from the worker bootstrap to the runtime.

Nothing leaves this machine: the foreign master is a TEST-NET address that no interface here
holds (no packet is sent to it: the address is refused before any connection), and the name
that does not resolve ends in ``.invalid``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from _procs import free_port
from unirank import netroute
from unirank.errors import ConfigError
from unirank.store import (
    StoreError,
    hand_over,
    open_store,
    take_joined,
    uses_agent_store,
)

#: TEST-NET-2 (RFC 5737): on no interface of this host
FOREIGN = "198.51.100.7"
HINT = "check that rank 0 started"


@pytest.fixture
def served() -> Iterator[tuple[object, int]]:
    """A store served here on a free port, and that port."""
    port = free_port()
    store = open_store("127.0.0.1", port, rank=0, timeout=30, serve=True, hint=HINT)
    yield store, port
    del store


@pytest.fixture(autouse=True)
def _nothing_handed() -> Iterator[None]:
    """Each test starts and ends with no store handed over (a bootstrap never ran here)."""
    take_joined(rank=-1, world_size=0, addr="", port=0)
    yield
    take_joined(rank=-1, world_size=0, addr="", port=0)


def test_a_served_store_is_reached_by_a_client(served: tuple[object, int]) -> None:
    server, port = served
    client = open_store("127.0.0.1", port, rank=1, timeout=30, hint=HINT)
    client.set("key", "value")
    assert bytes(server.get("key")) == b"value"  # type: ignore[attr-defined]


def test_a_master_that_does_not_resolve_is_a_config_error_naming_its_source() -> None:
    with pytest.raises(ConfigError) as info:
        open_store("no.such.host.invalid", free_port(), rank=1, timeout=5, hint=HINT,
                   addr_source="--master-addr")
    message = str(info.value)
    assert message.startswith("--master-addr='no.such.host.invalid': ")
    assert "\n" not in message


def test_serving_on_a_foreign_address_is_a_config_error_naming_it() -> None:
    if netroute.is_own(FOREIGN, netroute.interfaces()):
        pytest.fail(f"{FOREIGN} (TEST-NET-2) is an address of this host: pick another")
    with pytest.raises(ConfigError) as info:
        open_store(FOREIGN, free_port(), rank=0, timeout=5, serve=True, hint=HINT,
                   environ={})
    assert str(info.value).startswith(f"MASTER_ADDR='{FOREIGN}': is not an address of this "
                                      "host")


def test_a_taken_port_is_a_config_error_naming_master_port() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError) as info:
            open_store("127.0.0.1", port, rank=0, timeout=5, serve=True, hint=HINT)
    message = str(info.value)
    assert message.startswith(f"MASTER_PORT='{port}': is already in use on this host")
    assert message.endswith("HINT: export MASTER_PORT=<a free port, the same on every rank>")


def test_nothing_listening_is_one_store_error_naming_rank_address_timeout_and_hint() -> None:
    port = free_port()
    with pytest.raises(StoreError) as info:
        open_store("127.0.0.1", port, rank=3, timeout=0.3, served_by="rank 0", hint=HINT)
    error = info.value
    assert error.rank == 3
    assert str(error) == f"rank 3 {error.what}"
    assert error.what.startswith(f"could not reach the rendezvous store of rank 0 at "
                                 f"127.0.0.1:{port} within 0.3 s (")
    assert error.what.endswith(f"HINT: {HINT}")
    assert "\n" not in str(error)


def test_uses_agent_store_only_when_torchelastic_says_true() -> None:
    assert uses_agent_store({"TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert not uses_agent_store({"TORCHELASTIC_USE_AGENT_STORE": "False"})
    assert not uses_agent_store({})


def test_the_handed_store_is_taken_once_by_the_same_rank_and_world() -> None:
    store = object()
    hand_over(store, rank=1, world_size=2, addr="127.0.0.1", port=29500)
    assert take_joined(rank=1, world_size=2, addr="127.0.0.1", port=29500) is store
    assert take_joined(rank=1, world_size=2, addr="127.0.0.1", port=29500) is None


@pytest.mark.parametrize("asked", [
    {"rank": 0, "world_size": 2, "addr": "127.0.0.1", "port": 29500},
    {"rank": 1, "world_size": 4, "addr": "127.0.0.1", "port": 29500},
    {"rank": 1, "world_size": 2, "addr": "node1", "port": 29500},
    {"rank": 1, "world_size": 2, "addr": "127.0.0.1", "port": 29501},
])
def test_another_world_takes_nothing_and_the_hand_over_is_spent(asked: dict[str, object]) -> None:
    hand_over(object(), rank=1, world_size=2, addr="127.0.0.1", port=29500)
    assert take_joined(**asked) is None  # type: ignore[arg-type]
    assert take_joined(rank=1, world_size=2, addr="127.0.0.1", port=29500) is None


def test_nothing_handed_is_none() -> None:
    assert take_joined(rank=0, world_size=1, addr="127.0.0.1", port=29500) is None


def test_a_store_handed_in_another_process_is_not_taken() -> None:
    """A forked child inherits the parent's list: the pid tells them apart."""
    read_end, write_end = os.pipe()
    hand_over(object(), rank=0, world_size=1, addr="127.0.0.1", port=29500)
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        taken = take_joined(rank=0, world_size=1, addr="127.0.0.1", port=29500)
        os.write(write_end, b"none" if taken is None else b"taken")
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        said = reader.read()
    os.waitpid(child, 0)
    assert said == b"none"
