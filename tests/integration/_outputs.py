"""Parsing and checking what the examples print, and running commands, for the integration tests.

* hello (``examples/helloworld.py``, ``unirank hello``):
  ``[http://MASTER_ADDR:MASTER_PORT] hello from [NODE:BACKEND] process RANK/WORLD``
* reduction (``examples/reduction.py``, ``unirank reduce``):
  ``[http://ADDR:PORT] [NODE:BACKEND] process RANK/WORLD has data tensor([W.])``
* ``tests/integration/scripts/with_info.sh``: ``UNIRANK_INFO {json of unirank info --json}``
* the helper scripts under ``tests/integration/scripts/``: ``TAG {json}`` lines.

A line may carry a prefix (``srun --label``'s ``0: ``, ``--tag-output``'s ``[rank0]:``); the
parsers search for the pattern anywhere in the line.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from _procs import launcher_free_environ

__all__ = [
    "EXAMPLES",
    "JOB_ENV",
    "PY",
    "REPO",
    "SCRIPTS",
    "RankLine",
    "check_world",
    "console_script",
    "parse_hello",
    "parse_reduce",
    "run_local",
    "slurm_port",
    "tagged_json",
    "task_infos",
    "with_info",
]

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
SCRIPTS = Path(__file__).resolve().parent / "scripts"
PY = sys.executable
#: every job's ranks give up joining after this long, naming the missing ones (never a hang)
JOB_ENV = {"UNIRANK_INIT_TIMEOUT": "60"}

_ADDR = r"\[http://(?P<addr>[^\]\s]+):(?P<port>\d+)\]"
_WHO = r"\[(?P<node>[^:\]\s]+):(?P<backend>[^\]\s]+)\] process (?P<rank>\d+)/(?P<world>\d+)"
HELLO_RE = re.compile(rf"{_ADDR} hello from {_WHO}\s*$")
REDUCE_RE = re.compile(
    rf"{_ADDR} {_WHO} has data tensor\(\[(?P<value>[-+0-9.e]+)\]"
    r"(?:, device='(?P<device>[^']+)')?\)\s*$"
)


@dataclass(frozen=True)
class RankLine:
    """One rank's line of hello or reduction output."""

    addr: str
    port: int
    node: str
    backend: str
    rank: int
    world: int
    value: Optional[float] = None  # reduction only
    device: Optional[str] = None  # reduction on a GPU only


def _parse(text: str, pattern: re.Pattern[str]) -> list[RankLine]:
    lines = []
    for line in text.splitlines():
        m = pattern.search(line)
        if m is None:
            continue
        groups = m.groupdict()
        value = groups.get("value")
        lines.append(
            RankLine(
                addr=groups["addr"],
                port=int(groups["port"]),
                node=groups["node"],
                backend=groups["backend"],
                rank=int(groups["rank"]),
                world=int(groups["world"]),
                value=float(value) if value is not None else None,
                device=groups.get("device"),
            )
        )
    return lines


def parse_hello(text: str) -> list[RankLine]:
    """Every hello line in ``text``, in the order printed."""
    return _parse(text, HELLO_RE)


def parse_reduce(text: str) -> list[RankLine]:
    """Every reduction line in ``text``, in the order printed."""
    return _parse(text, REDUCE_RE)


def tagged_json(text: str, tag: str) -> list[dict[str, Any]]:
    """The JSON objects of the lines ``TAG {json}`` in ``text`` (a prefix before TAG is allowed)."""
    found = []
    marker = f"{tag} "
    for line in text.splitlines():
        at = line.find(marker)
        if at >= 0 and line[at + len(marker):].lstrip().startswith("{"):
            found.append(json.loads(line[at + len(marker):]))
    return found


def slurm_port(job_id: int | str, step_id: int | str) -> int:
    """README's port formula: ``20000 + 12 * (job_id mod 1000) + (step_id mod 12)``."""
    return 20000 + 12 * (int(job_id) % 1000) + (int(step_id) % 12)


def check_world(
    lines: Sequence[RankLine],
    world: int,
    *,
    addr: Optional[str] = None,
    port: Optional[int] = None,
    nodes: Optional[Sequence[str] | Mapping[int, str]] = None,
    backend: Optional[str] = "gloo",
    reduced: bool = False,
    context: str = "",
) -> dict[int, RankLine]:
    """Assert that ``lines`` are one line per rank of one world of ``world`` ranks; by rank.

    Checks: the ranks are exactly ``0..world-1``, each once; every line says ``world``; every
    line names the same master address and port (``addr``/``port`` when given); rank ``r`` ran
    on ``nodes[r]`` (when given); the backend (when not ``None``); with ``reduced``, every rank
    holds the value ``world``. ``context`` (e.g. the command's output) goes into the messages.
    """
    where = f"\n--- output ---\n{context}" if context else ""
    ranks = sorted(line.rank for line in lines)
    assert ranks == list(range(world)), f"ranks {ranks}, expected 0..{world - 1}{where}"
    by_rank = {line.rank: line for line in lines}
    worlds = {line.world for line in lines}
    assert worlds == {world}, f"world sizes {worlds}, expected {world}{where}"
    masters = {(line.addr, line.port) for line in lines}
    assert len(masters) == 1, f"ranks disagree on the master: {masters}{where}"
    if addr is not None:
        assert lines[0].addr == addr, f"master address {lines[0].addr}, expected {addr}{where}"
    if port is not None:
        assert lines[0].port == port, f"master port {lines[0].port}, expected {port}{where}"
    if nodes is not None:
        expected = dict(enumerate(nodes)) if not isinstance(nodes, Mapping) else dict(nodes)
        seen = {r: by_rank[r].node for r in range(world)}
        assert seen == expected, f"nodes by rank {seen}, expected {expected}{where}"
    if backend is not None:
        backends = {line.backend for line in lines}
        assert backends == {backend}, f"backends {backends}, expected {backend}{where}"
    if reduced:
        values = {r: by_rank[r].value for r in range(world)}
        assert all(v == float(world) for v in values.values()), (
            f"all_reduce results {values}, expected {float(world)} on every rank{where}"
        )
    return by_rank


def only(items: Iterable[Any], what: str) -> Any:
    """The single distinct item of ``items`` (asserting that there is exactly one)."""
    distinct = set(items)
    assert len(distinct) == 1, f"expected one {what}, got {sorted(map(str, distinct))}"
    return next(iter(distinct))


# --- running things ---------------------------------------------------------------------------


def console_script(name: str) -> str:
    """The absolute path of console script ``name`` (``unirank``, ``torchrun``) of this Python."""
    beside = Path(sys.executable).with_name(name)
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    assert found, f"{name} is not installed next to {sys.executable} nor on PATH"
    return found


def with_info(*command: str) -> list[str]:
    """``COMMAND`` prefixed by ``scripts/with_info.sh``: each task first prints ``UNIRANK_INFO``."""
    return [str(SCRIPTS / "with_info.sh"), console_script("unirank"), *command]


def task_infos(text: str) -> list[dict[str, Any]]:
    """The ``UNIRANK_INFO`` records of :func:`with_info`, sorted by the detected rank."""
    records = tagged_json(text, "UNIRANK_INFO")
    return sorted(records, key=lambda r: int(r["info"]["rank"]))


def run_local(
    cmd: Sequence[str],
    timeout: float = 120.0,
    env: Optional[Mapping[str, str]] = None,
    cwd: Path = REPO,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` here (own session, clean environment + ``env``) with a timeout.

    On timeout the whole process group is killed (workers included) and the test fails with
    the output so far.
    """
    proc = subprocess.Popen(
        list(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=launcher_free_environ({**JOB_ENV, **(env or {})}), cwd=cwd,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(
            f"{' '.join(cmd)} did not finish in {timeout:g} s; killed\n"
            f"stdout:\n{stdout}\nstderr:\n{stderr}"
        ) from None
    return subprocess.CompletedProcess(list(cmd), proc.returncode, stdout, stderr)


