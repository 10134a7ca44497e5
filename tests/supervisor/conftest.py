"""Helpers for the supervisor's tests: start ``unirank run`` for real, read its output with
deadlines, and wait (with a timeout, never a fixed sleep) for processes to vanish.

Environment variables read: the caller's environment, from which launcher variables (RANK,
SLURM_*, OMPI_*, ...) are removed so that ``unirank run`` sees no outer launcher.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Optional

import pytest

from _procs import launcher_free_environ, wait_gone

TIMEOUT = 120.0


def local_environ(extra: Optional[Mapping[str, str]] = None,
                  drop: Sequence[str] = ()) -> dict[str, str]:
    """This environment without any launcher's variables (nor those in ``drop``), plus
    ``extra``."""
    return launcher_free_environ(extra, drop=drop)


class Runner:
    """Starts ``python -m unirank run ...`` and reads what it says."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self._started: list[subprocess.Popen[bytes]] = []

    def script(self, name: str, text: str) -> Path:
        """Write a worker script into the test's folder."""
        path = self.cwd / name
        path.write_text(text)
        return path

    def run(self, args: Sequence[str], *, timeout: float = TIMEOUT,
            env: Optional[Mapping[str, str]] = None) -> subprocess.CompletedProcess[str]:
        """Run ``unirank run ARGS`` to the end."""
        return subprocess.run(
            [sys.executable, "-m", "unirank", "run", *args], cwd=self.cwd,
            env=local_environ(env), capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def start(self, args: Sequence[str], *, env: Optional[Mapping[str, str]] = None,
              command: Optional[Sequence[str]] = None, stdout: Optional[int] = None,
              drop: Sequence[str] = ()) -> subprocess.Popen[bytes]:
        """Start ``unirank run ARGS`` (or ``command``) with piped stderr, and stdout piped or
        on the fd ``stdout``, without the variables in ``drop``."""
        argv = list(command) if command else [sys.executable, "-m", "unirank", "run", *args]
        proc = subprocess.Popen(argv, cwd=self.cwd, env=local_environ(env, drop),
                                stdout=subprocess.PIPE if stdout is None else stdout,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self._started.append(proc)
        return proc

    timeout = TIMEOUT

    @staticmethod
    def read_lines(stream: IO[bytes], count: int, *, contains: str = "",
                   timeout: float = TIMEOUT) -> list[str]:
        """See :func:`read_lines`."""
        return read_lines(stream, count, contains=contains, timeout=timeout)

    @staticmethod
    def wait_gone(pids: Sequence[int], timeout: float = 30.0,
                  mark: bytes = os.fsencode(sys.executable)) -> list[int]:
        """See :func:`wait_gone`."""
        return wait_gone(pids, timeout, mark)  # from tests/_procs.py

    def close(self) -> None:
        for proc in self._started:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=TIMEOUT)


def read_lines(stream: IO[bytes], count: int, *, contains: str = "",
               timeout: float = TIMEOUT) -> list[str]:
    """Read lines from ``stream`` until ``count`` of them contain ``contains``; fail on timeout
    or end of stream. Returns every line read."""
    fd = stream.fileno()
    os.set_blocking(fd, False)
    lines: list[str] = []
    buffer = b""
    found = 0
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while found < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out after {timeout} s; read so far: {lines}")
            if not selector.select(remaining):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"stream ended; read so far: {lines} {buffer!r}")
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                text = line.decode(errors="replace")
                lines.append(text)
                if contains in text:
                    found += 1
    os.set_blocking(fd, True)
    return lines


#: on the command line of every worker (a fresh interpreter's: the interpreter, then the target)
WORKER_MARK = os.fsencode(sys.executable)


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[Runner]:
    """A :class:`Runner` in a fresh folder; kills what it started at the end."""
    made = Runner(tmp_path)
    yield made
    made.close()


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test started; killed at its end."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=TIMEOUT)
