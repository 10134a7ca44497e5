"""Fixtures of the runtime tests: this process's cached DistEnv, replaced and restored."""

from __future__ import annotations

import contextlib
import logging
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


@contextlib.contextmanager
def logged(name: str) -> Iterator[list[str]]:
    """The messages logged to logger ``name`` while the block runs."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger(name)
    handler = Keep()
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


@pytest.fixture
def parallel_lines() -> Iterator[list[str]]:
    """The messages logged to Parallel's logger while the test runs."""
    with logged("ignite.distributed.launcher.Parallel") as lines:
        yield lines


@pytest.fixture
def config_lines() -> Iterator[list[str]]:
    """The messages logged to show_config's logger while the test runs."""
    with logged("ignite.distributed.utils") as lines:
        yield lines
