"""unirank answers ignite 0.5.5's inputs as ignite does: the calls ignite's own tests make.

* a group made by hand as ignite's fixtures make it (``LOCAL_RANK`` and ``WORLD_SIZE`` set, no
  ``RANK``, ``init_process_group(rank=r, world_size=2)``): the per-node numbers, the collectives'
  types and checks, ``auto_dataloader``'s batch rule; then ``RANK`` set after a first getter and
  ``initialize("gloo", init_method="file://...")`` (scripts/hand_made_group.py, two ranks, run
  without numpy for unirank). The expected values are ignite's; with ignite installed, the same
  script under ignite must give them too;
* ``Parallel``'s checks when it is built, its log lines, and ``init_method="file://..."`` with
  ``Parallel`` and ``spawn`` (scripts/file_init_job.py).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import unirank as idist
from _procs import free_port, launcher_free_environ
from conftest import unavailable
from unirank.distenv import DistEnv
from unirank.runtime import layout

SCRIPTS = Path(__file__).parent / "scripts"
TIMEOUT = 180

#: what ignite 0.5.5 gives on each rank (``{rank}``: the rank) for scripts/hand_made_group.py
EXPECTED: dict[str, Any] = {
    "get_rank": "{rank}", "get_world_size": 2, "get_local_rank": "{rank}",
    "get_nproc_per_node": 2, "get_nnodes": 1, "get_node_rank": 0,
    "backend": "gloo", "model_name": "native-dist", "one_rank_first_local": "ok",
    "gather_str": ["abc", "de" * 300], "gather_int": [10, 11], "gather_float": [0.5, 1.5],
    "gather_dict": [{"r": [0]}, {"r": [1]}], "gather_0d": [0, 1],
    "gather_bad_group": "raised ValueError", "reduce_bad_group": "raised ValueError",
    "reduce_str": "raised TypeError", "reduce_bad_op": "raised ValueError",
    "bcast_str": "from 1", "bcast_path": "Path(/x)", "bcast_list": "raised TypeError",
    "bcast_none": "raised ValueError", "new_group_bad": "raised ValueError",
    "loader_bs1": [1, 0, True], "loader_bs5_nw1": [2, 1, True], "loader_bs8_nw4": [4, 2, True],
    "serial_world": 1, "late_world": ["{rank}", 2, "{rank}"], "late_gather": [0, 1],
}

#: where unirank answers otherwise, on purpose (docs/ignite.md, "Where the meaning differs"):
#: ``broadcast`` takes any picklable object, as ``all_gather`` does
UNIRANK_DIFFERS: dict[str, Any] = {"bcast_list": [0, 1, 2]}


def _expected(rank: int, differs: dict[str, Any] | None = None) -> dict[str, Any]:
    def fill(value: Any) -> Any:
        if value == "{rank}":
            return rank
        return [fill(item) for item in value] if isinstance(value, list) else value

    return {key: fill(value) for key, value in {**EXPECTED, **(differs or {})}.items()}


def _two_ranks(impl: str, folder: Path, extra: dict[str, str]) -> dict[int, dict[str, Any]]:
    """scripts/hand_made_group.py on two ranks; each rank's results."""
    folder.mkdir()
    port = str(free_port())
    environ = launcher_free_environ(extra)
    procs = [subprocess.Popen([sys.executable, str(SCRIPTS / "hand_made_group.py"), impl,
                               str(rank), port, str(folder)],
                              env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, stdin=subprocess.DEVNULL) for rank in (0, 1)]
    outputs = [proc.communicate(timeout=TIMEOUT)[0] for proc in procs]
    for proc, output in zip(procs, outputs):
        assert proc.returncode == 0, f"{impl}:\n{output[-4000:]}"
    return {rank: json.loads((folder / f"rank{rank}.json").read_text()) for rank in (0, 1)}


def test_a_hand_made_group_answers_as_ignite_without_numpy(tmp_path: Path) -> None:
    results = _two_ranks("unirank", tmp_path / "unirank", {"HIDE_NUMPY": "1"})
    for rank in (0, 1):
        assert results[rank] == _expected(rank, UNIRANK_DIFFERS)


def test_ignite_itself_gives_the_expected_values(tmp_path: Path) -> None:
    if importlib.util.find_spec("ignite") is None:
        unavailable("pytorch-ignite is not installed (pip install -e '.[test]')")
    results = _two_ranks("ignite", tmp_path / "ignite", {})
    for rank in (0, 1):
        assert results[rank] == _expected(rank)


def test_node_and_local_rank_follow_the_host_names() -> None:
    hosts = ["a", "a", "b", "b", "b"]
    assert [layout.node_and_local_rank(r, hosts) for r in range(5)] == [
        (0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]


def test_the_local_rank_of_a_hand_made_group_comes_from_the_environment() -> None:
    assert layout.local_rank_from({"LOCAL_RANK": "3"}, None) == 3
    assert layout.local_rank_from({"SLURM_JOB_ID": "7", "SLURM_LOCALID": "2",
                                   "LOCAL_RANK": "3"}, None) == 2
    assert layout.local_rank_from({}, 5) == 5
    assert layout.local_rank_from({}, None) is None


BAD_CONFIGURATIONS: list[dict[str, Any]] = [
    {"backend": "abc"},
    {"nnodes": 2},
    {"nproc_per_node": 2},
    {"backend": "gloo", "nproc_per_node": -1},
    {"backend": "gloo", "nproc_per_node": 1, "nnodes": -1},
    {"backend": "gloo", "nproc_per_node": 1, "nnodes": 2},
    {"backend": "gloo", "nproc_per_node": 1, "nnodes": 2, "node_rank": 2},
    {"backend": "gloo", "nproc_per_node": 1, "nnodes": 2, "node_rank": 1},
    {"backend": "gloo", "nproc_per_node": 1, "init_method": "tcp://10.1.1.20:23456"},
]


@pytest.mark.parametrize("arguments", BAD_CONFIGURATIONS)
def test_parallel_refuses_a_bad_configuration_when_built(
    serial: DistEnv, arguments: dict[str, Any]
) -> None:
    with pytest.raises(ValueError):
        idist.Parallel(**arguments)


def test_parallel_takes_the_master_port_as_a_string(serial: DistEnv) -> None:
    parallel = idist.Parallel(backend="gloo", nproc_per_node=2, nnodes=2, node_rank=0,
                              master_addr="127.0.0.1", master_port="3344")
    assert parallel._request["master_port"] == 3344



def test_parallel_logs_ignite_s_lines(serial: DistEnv, parallel_lines: list[str]) -> None:
    def body(local_rank: int) -> None:
        """Nothing to do."""

    with idist.Parallel(backend=None) as parallel:
        parallel.run(body)
    assert parallel_lines == [f"- Run '{body}' in 1 processes", "End of run"]


def test_parallel_and_spawn_start_groups_on_a_file_init_method(tmp_path: Path) -> None:
    environ = launcher_free_environ({"MASTER_PORT": str(free_port())})
    proc = subprocess.run([sys.executable, str(SCRIPTS / "file_init_job.py"), str(tmp_path)],
                          env=environ, capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = sorted(line for line in proc.stdout.splitlines() if line.startswith("RESULT"))
    assert results == [f"RESULT {how} {rank} 2 gloo {tmp_path / how}"
                       for how in ("parallel", "spawn") for rank in (0, 1)]
    assert "Spawn function" in proc.stderr and "in 2 processes" in proc.stderr
    assert proc.stderr.count("End of run") == 2
