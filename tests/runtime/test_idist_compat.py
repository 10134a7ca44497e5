"""An idist program runs unchanged with ``import unirank as idist``, with ignite's results.

The same program (scripts/idist_program.py, calling every public name of ignite.distributed)
runs once with ``import ignite.distributed as idist`` and once with ``import unirank as idist``,
under ``Parallel(backend="gloo", nproc_per_node=2)``, under ``idist.spawn("gloo", ...)`` and
under ``torchrun --nproc_per_node 2``; each rank's JSON of what every call returned must match.
The one expected difference: ``show_config`` logs ignite's lines and then unirank's own (the
launcher and where each number came from), on rank 0 (rank 1 logs nothing, as in ignite).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from _procs import free_port, launcher_free_environ, unavailable

SCRIPT = Path(__file__).parent / "scripts" / "idist_program.py"
TIMEOUT = 240


def _command(mode: str, folder: Path) -> list[str]:
    program = [str(SCRIPT), mode, str(folder)]
    if mode == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", "2", *program]
    return [sys.executable, *program]


def _run(impl: str, mode: str, folder: Path) -> dict[int, dict[str, Any]]:
    """Run the program with ``impl`` as idist; every rank's results by rank."""
    folder.mkdir()
    # ignite's default port is 2222: a free one instead
    env = launcher_free_environ({"IDIST_IMPL": impl, "MASTER_PORT": str(free_port())})
    proc = subprocess.run(_command(mode, folder), env=env, capture_output=True, text=True,
                          timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{impl} under {mode}:\n{proc.stderr[-4000:]}"
    return {rank: json.loads((folder / f"rank{rank}.json").read_text()) for rank in (0, 1)}


def _differences(ignite: dict[str, Any], unirank: dict[str, Any]) -> dict[str, Any]:
    return {key: {"ignite": ignite.get(key), "unirank": unirank.get(key)}
            for key in sorted(ignite.keys() | unirank.keys())
            if ignite.get(key) != unirank.get(key)}


@pytest.mark.parametrize("mode", ["parallel", "spawn", "torchrun"])
def test_the_same_idist_program_returns_the_same_with_unirank(mode: str, tmp_path: Path) -> None:
    if importlib.util.find_spec("ignite") is None:
        unavailable("pytorch-ignite is not installed (pip install -e '.[test]')")
    ignite = _run("ignite", mode, tmp_path / "ignite")
    unirank = _run("unirank", mode, tmp_path / "unirank")
    for rank in (0, 1):
        theirs, ours = dict(ignite[rank]), dict(unirank[rank])
        their_log, our_log = theirs.pop("show_config")["items"], ours.pop("show_config")["items"]
        assert our_log[:len(their_log)] == their_log, (rank, our_log)
        if rank == 0:
            assert "rank: 0" in our_log and "launcher: torchrun" in " ".join(our_log)
        else:
            assert our_log == []  # rank 0 logs, as in ignite
        assert _differences(theirs, ours) == {}, f"rank {rank} under {mode}"
        # the program really ran distributed (a serial run would also agree with itself)
        assert (ours["model_name"], ours["world_size"], ours["rank"]) == ("native-dist", 2, rank)
        assert ours["reduce_int"] == 3 and ours["gather_str"]["items"] == ["r", "rr"]
    if mode == "torchrun":
        for impl in ("ignite", "unirank"):
            lifecycle = json.loads((tmp_path / impl / "lifecycle0.json").read_text())
            assert lifecycle == {"before": "serial", "after": "serial"}, impl
