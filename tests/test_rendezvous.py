"""Master port derivation: deterministic, outside the ephemeral range, distinct across steps."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unirank.errors import ConfigError
from unirank.rendezvous import DEFAULT_PORT, derive_port, explicit_master


def test_formula_as_documented() -> None:
    assert derive_port("123456", "3") == 20000 + 12 * 456 + 3
    assert derive_port(None) == DEFAULT_PORT
    assert derive_port("42", None) == 20000 + 12 * 42


@given(st.integers(0, 10**9), st.integers(0, 10**6))
def test_port_is_below_ephemeral_range(job: int, step: int) -> None:
    assert 20000 <= derive_port(str(job), str(step)) < 32768


@given(st.integers(0, 10**9))
def test_twelve_steps_of_one_job_get_twelve_ports(job: int) -> None:
    assert len({derive_port(str(job), str(s)) for s in range(12)}) == 12


@given(st.integers(0, 10**9), st.integers(1, 999))
def test_neighbouring_jobs_do_not_collide(job: int, gap: int) -> None:
    assert derive_port(str(job), "0") != derive_port(str(job + gap), "0")


def test_non_numeric_ids_are_stable() -> None:
    assert derive_port("abc", "batch") == derive_port("abc", "batch")


@pytest.mark.parametrize("value", ["0", "65536", "-1", "port", ""])
def test_bad_master_port(value: str) -> None:
    with pytest.raises(ConfigError, match="^MASTER_PORT="):
        explicit_master({"MASTER_PORT": value})


def test_explicit_master() -> None:
    assert explicit_master({"MASTER_ADDR": " node7 ", "MASTER_PORT": "1234"}) == ("node7", 1234)
    assert explicit_master({}) == (None, None)
