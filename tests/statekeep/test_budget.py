"""The snapshot memory's budget (pure): its spellings, and when a step does not fit."""

from __future__ import annotations

import pytest

from unirank.errors import ConfigError
from unirank.statekeep.budget import format_bytes, parse_budget, refusal

GIB = 1 << 30


@pytest.mark.parametrize(("text", "size"), [
    ("50%", 8 * GIB), ("100%", 16 * GIB), ("0%", 0), ("12.5%", 2 * GIB),
    ("8G", 8 * GIB), ("8GiB", 8 * GIB), ("512M", 512 << 20), ("4096", 4096), ("1.5g", 3 * GIB // 2),
])
def test_a_budget_is_a_share_of_dev_shm_or_a_size(text: str, size: int) -> None:
    assert parse_budget(text, 16 * GIB, variable="UNIRANK_STATE_BUDGET") == size


@pytest.mark.parametrize("text", ["", "half", "150%", "-1G", "8X", "%"])
def test_anything_else_is_refused_naming_the_variable(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_budget(text, GIB, variable="--state-budget")
    assert caught.value.variable == "--state-budget"
    assert "50%" in str(caught.value.hint)


def test_a_step_fits_within_the_budget_and_the_free_room() -> None:
    assert refusal(GIB, GIB, 10 * GIB, 2 * GIB) is None
    assert refusal(GIB, GIB + 1, 10 * GIB, 2 * GIB) == (
        "a snapshot of 1.0 GiB does not fit the node's snapshot memory (1.0 GiB held, budget "
        "2.0 GiB)")
    assert refusal(GIB, 0, GIB - 1, 2 * GIB) == (
        "a snapshot of 1.0 GiB does not fit in the shared memory left (1024.0 MiB free)")


def test_sizes_read_as_people_write_them() -> None:
    assert [format_bytes(n) for n in (100, 2048, 3 << 20, 5 << 30)] == [
        "100 B", "2.0 KiB", "3.0 MiB", "5.0 GiB"]


def test_a_share_is_of_dev_shm_or_of_the_memory_available_the_smaller() -> None:
    """In a container /dev/shm is often all the machine's memory, shared by the nodes of one
    host: 50% of it would let the snapshots take what the program needs."""
    assert parse_budget("50%", 24 * GIB, variable="V", memory=6 * GIB) == 3 * GIB
    assert parse_budget("50%", 4 * GIB, variable="V", memory=6 * GIB) == 2 * GIB
    assert parse_budget("8G", 4 * GIB, variable="V", memory=GIB) == 8 * GIB  # a size is a size
