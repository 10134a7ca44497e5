"""Fixtures of the runtime tests: this process's cached DistEnv, replaced and restored."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from unirank.distenv import DistEnv
from unirank.runtime import state


@pytest.fixture
def use_env() -> Iterator[None]:
    """Restore the cached DistEnv (and forget a ``set_local_rank`` hint) after a test."""
    saved = state.STATE.env
    try:
        yield
    finally:
        state.set_dist_env(saved)
        state.STATE.local_rank_hint = None


@pytest.fixture
def serial(use_env: None) -> DistEnv:
    """This process as a serial run, whatever the shell running pytest carries."""
    env = DistEnv(launcher="local", node_name="box")
    state.set_dist_env(env)
    return env
