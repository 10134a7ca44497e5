"""Process helpers shared by the tests: waiting for processes to be gone, on pidfds (no
polling), for the tests that prove no worker outlives its supervisor, its parent or its failed
step; running a Python snippet in a fresh interpreter; and running a job script that prints
``RESULT {json}`` lines, without the launcher variables of the shell running pytest.

Importable from any test module: tests/conftest.py puts this folder on ``sys.path``.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional

#: prefixes of the launcher variables a job script must not inherit from the shell
LAUNCHER_VARS = ("SLURM", "OMPI_", "PMI", "MPI_", "MV2_", "JSM_", "LSB_", "PBS_", "RANK",
                 "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "GROUP_", "ROLE_", "MASTER_",
                 "TORCHELASTIC_", "UNIRANK_")


def is_live(pid: int, mark: Optional[bytes] = None) -> bool:
    """True while ``pid`` is a running (not zombie) process, whose command line contains
    ``mark`` when one is given (so that a recycled pid is not mistaken for the old process)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            command = cmdline.read()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z" and (mark is None or mark in command)


def wait_gone(pids: Iterable[int], timeout: float = 30.0,
              mark: Optional[bytes] = None) -> list[int]:
    """Wait until none of ``pids`` is live (see :func:`is_live`); return those still live at the
    timeout. Blocks on pidfds, which become readable when a process exits."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    fds: dict[int, int] = {}
    try:
        for pid in pids:
            if not is_live(pid, mark):
                continue
            try:
                fds[os.pidfd_open(pid)] = pid
            except ProcessLookupError:
                continue
        with selectors.DefaultSelector() as selector:
            for fd in fds:
                selector.register(fd, selectors.EVENT_READ)
            waiting = set(fds)
            while waiting:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                for key, _ in selector.select(remaining):
                    selector.unregister(key.fd)
                    waiting.discard(key.fd)
    finally:
        for fd in fds:
            os.close(fd)
    return [pid for pid in pids if is_live(pid, mark)]


def assert_snippet_runs(code: str, timeout: float = 60) -> None:
    """Run ``code`` with this interpreter in a fresh process; fail with its stderr unless it
    exits 0 (for checks of what an import pulls in, which the test process has already done)."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr


def run_job(script: Path, *args: str, timeout: float = 120) -> list[dict[str, Any]]:
    """Run ``script`` (which prints one ``RESULT {json}`` line per rank) with this interpreter,
    without launcher variables; fail with its stderr unless it exits 0; return the results
    sorted by their ``rank``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARS)}
    proc = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines()
               if line.startswith("RESULT ")]
    return sorted(results, key=lambda result: int(result.get("rank", 0)))
