"""Every worker draws its own random numbers, as a fresh interpreter does: torch's CPU default
generator, Python's ``random`` and numpy's legacy global generator differ between the ranks of
a run and between a run's attempts (``--max-restarts``), with workers forked from the fork
server and with ``--no-preload``, under ``unirank run`` and under ``Parallel``. Forked workers
used to share the server's torch stream (same ``torch.initial_seed()`` on every rank).

Real processes throughout: ``unirank run`` and a script calling ``Parallel``.

Environment variables read: the caller's environment without launcher variables (and without
UNIRANK_NO_PRELOAD, which each test sets itself).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from _procs import Runner, launcher_free_environ

pytestmark = pytest.mark.integration

TIMEOUT = 180.0
#: what each worker prints: one draw from each stream that a fresh interpreter seeds itself
_DRAWS = """
import json, multiprocessing, random
import numpy, torch
def draws():
    return {"torch_seed": torch.initial_seed(), "torch": torch.rand(4).tolist(),
            "randperm": torch.randperm(16).tolist(), "random": random.random(),
            "numpy": numpy.random.rand(),
            "authkey": bytes(multiprocessing.current_process().authkey).hex()}
"""
_SCRIPT = _DRAWS + """
import os
print("DRAWS", json.dumps({"rank": int(os.environ["RANK"]),
                           "restart": int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
                           **draws()}), flush=True)
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    import torch.distributed as dist
    dist.init_process_group("gloo")
    dist.barrier()  # both ranks printed
    if dist.get_rank() == 1:
        raise SystemExit(3)  # one failed attempt, so that --max-restarts starts a second
"""
_PARALLEL = _DRAWS + """
import unirank as ur
def work(local_rank):
    print("DRAWS", json.dumps({"rank": ur.get_rank(), "restart": 0, **draws()}), flush=True)
    ur.barrier()  # no rank ends (and closes its gloo pairs) while another still connects
if __name__ == "__main__":
    with ur.Parallel(backend="gloo", nproc_per_node=3) as parallel:
        parallel.run(work)
"""
STREAMS = ("torch_seed", "torch", "randperm", "random", "numpy", "authkey")


def _draws(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(m) for m in re.findall(r"^DRAWS (.*)$", stdout, re.M)]


def _assert_all_differ(found: list[dict[str, Any]], count: int) -> None:
    """``count`` workers reported, and no two of them drew the same from any stream."""
    assert len(found) == count, found
    for stream in STREAMS:
        values = [json.dumps(draw[stream]) for draw in found]
        assert len(set(values)) == count, (stream, values)


def _switch(preload: bool) -> dict[str, str]:
    """The no-preload lane's switch as the test chooses it (whatever the lane)."""
    return {} if preload else {"UNIRANK_NO_PRELOAD": "1"}


def _env(preload: bool) -> dict[str, str]:
    return launcher_free_environ(_switch(preload), drop=("UNIRANK_NO_PRELOAD",))


@pytest.mark.parametrize("preload", [True, False], ids=["forked", "no-preload"])
def test_ranks_and_restarts_draw_their_own_numbers(runner: Runner, preload: bool) -> None:
    """Two ranks, two attempts: four workers, four different draws from every stream."""
    runner.script("draws.py", _SCRIPT)
    result = runner.run(["-n", "2", "--max-restarts", "1", "draws.py"], env=_switch(preload),
                        drop=("UNIRANK_NO_PRELOAD",), timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    found = _draws(result.stdout)
    assert sorted((d["restart"], d["rank"]) for d in found) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    _assert_all_differ(found, 4)
    assert "starting workers as their own interpreters" not in result.stderr


@pytest.mark.parametrize("preload", [True, False], ids=["forked", "no-preload"])
def test_parallel_workers_draw_their_own_numbers(tmp_path: Path, preload: bool) -> None:
    (tmp_path / "parallel_draws.py").write_text(_PARALLEL)
    proc = subprocess.run([sys.executable, "parallel_draws.py"], cwd=tmp_path, env=_env(preload),
                          capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    _assert_all_differ(_draws(proc.stdout), 3)
