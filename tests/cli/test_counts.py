"""``unirank run``'s counts: --nproc-per-node and --nnodes (pure)."""

from __future__ import annotations

import pytest

from unirank.cli.counts import parse_nnodes, parse_nnodes_range, parse_nproc
from unirank.errors import ConfigError


@pytest.mark.parametrize(
    ("value", "gpus", "cpus", "expected"),
    [("4", 0, 2, 4), ("auto", 0, 2, 1), ("auto", 8, 2, 8), ("gpu", 2, 64, 2), ("cpu", 4, 64, 64),
     (" AUTO ", 3, 1, 3), ("cpu", 0, None, 1)],
)
def test_parse_nproc(value: str, gpus: int, cpus: int | None, expected: int) -> None:
    assert parse_nproc(value, gpu_count=gpus, cpu_count=cpus) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [("0", "must be at least 1"), ("-2", "must be at least 1"), ("two", "not a number"),
     ("gpu", "no GPU is visible")],
)
def test_parse_nproc_errors(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_nproc(value, gpu_count=0, cpu_count=8)
    assert info.value.variable == "--nproc-per-node"
    assert info.value.hint


def test_parse_nnodes() -> None:
    assert parse_nnodes("3") == 3
    assert parse_nnodes("2:2") == 2
    for bad, message in (("1:4", "elastic"), ("0", "at least 1"), ("x", "not a number")):
        with pytest.raises(ConfigError, match=message):
            parse_nnodes(bad)


def test_parse_nnodes_range() -> None:
    assert parse_nnodes_range("3") == (3, 3)
    assert parse_nnodes_range("1:4") == (1, 4)
    for bad, why in (("4:1", "MAX below MIN"), ("0:2", "at least 1"), ("a:b", "not a number")):
        with pytest.raises(ConfigError, match=why):
            parse_nnodes_range(bad)
    with pytest.raises(ConfigError, match="elastic range, which needs the dynamic rendezvous"):
        parse_nnodes("1:4")
