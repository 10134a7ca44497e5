"""A node that gives up tells the others (:mod:`unirank.supervisor.giveup`): the abort value
lands in a real store served here on 127.0.0.1, through the real child process; a store that
nothing serves is given up on within the bound, with False."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from _procs import free_port
from unirank.joincheck import ABORT_PREFIX, ALL_KEY
from unirank.store import open_store
from unirank.supervisor.giveup import _main, tell_others


@pytest.fixture
def served() -> Iterator[tuple[Any, int]]:
    """A store served here on a free port, and that port."""
    port = free_port()
    store = open_store("127.0.0.1", port, rank=0, timeout=30, serve=True, hint="")
    yield store, port
    del store


def test_the_reason_reaches_the_store_as_the_join_checks_abort_value(
        served: tuple[Any, int]) -> None:
    store, port = served
    assert tell_others("127.0.0.1", port, "node2 gave up:\n  --nproc-per-node  disagrees",
                       timeout=30)
    assert bytes(store.get(ALL_KEY)).decode() == \
        f"{ABORT_PREFIX}node2 gave up: --nproc-per-node disagrees"


def test_a_store_nobody_serves_is_given_up_on_with_false() -> None:
    assert tell_others("127.0.0.1", free_port(), "node2 gave up", timeout=0.5) is False


@pytest.mark.parametrize("argv", [["127.0.0.1", "not-a-port", "1", "why"],
                                  ["no.such.host.invalid", "29500", "1", "why"]])
def test_the_child_exits_1_when_it_cannot_set_the_value(argv: list[str]) -> None:
    assert _main(argv) == 1
