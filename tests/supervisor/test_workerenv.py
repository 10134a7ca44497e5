"""The complete environment of every worker, for a few layouts, against golden files.

Each layout goes the way a real run goes: ``unirank run``'s own option parsing (or the request
``Parallel`` makes), the launcher's detection of a recorded environment, the planner, the
engine's launches with a real listening socket, real pipes and a real log folder, and the
environment the engine hands to ``Popen``. The values that change from run to run (the port
the socket got, fds, the supervisor's pid, the temporary folder, the start time) are replaced
by placeholders; everything else must match ``tests/fixtures/worker_env/<layout>.json``
exactly, so that any change to the workers' contract shows up as a diff.

Regenerate after a deliberate change: ``UNIRANK_REGEN_GOLDEN=1 python3 -m pytest -q
tests/supervisor/test_workerenv.py``, then review ``git diff tests/fixtures/worker_env``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from unirank.cli.run import add_arguments, build_request, engine_options, target_of
from unirank.launchers import detect
from unirank.supervisor.attempts import EngineOptions
from unirank.supervisor.engine import worker_command
from unirank.supervisor.launching import attempt_launches
from unirank.supervisor.plan import LaunchRequest, Plan, make_plan
from unirank.supervisor.rdzv.spec import Assignment

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "worker_env"
RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "envs"
#: the shell's own variables every layout starts from
SHELL = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
#: variables whose values change from run to run, and what stands for them
CHANGING = {
    "MASTER_PORT": "<port>", "UNIRANK_SUPERVISOR_PID": "<supervisor pid>",
    "UNIRANK_STORE_FD": "<fd>", "UNIRANK_LINGER_FD": "<fd>", "UNIRANK_DONE_FD": "<fd>",
    "UNIRANK_TIMELINE": "<start time>",
}
STARTED = 1_700_000_000.25


@dataclass(frozen=True)
class Layout:
    """One node's plan, what the engine runs with it, and the environment it starts from."""

    plan: Plan
    target: list[str]
    options: EngineOptions
    base: dict[str, str]


def run_layout(argv: list[str], base: dict[str, str],
               assignment: Assignment | None = None) -> Layout:
    """``unirank run ARGV`` in a shell whose environment is ``base`` (at ``assignment``'s place
    after a dynamic rendezvous, when given)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(argv)
    outer = detect(base, ["unirank"], hostname="host")
    request = build_request(args, base, outer=outer)
    plan = make_plan(request, outer, base, run_id_fallback="run-id", assignment=assignment)
    return Layout(plan, target_of(args), engine_options(args, outer=outer), base)


def parallel_layout(tmp: Path) -> Layout:
    """``Parallel(nproc_per_node=2)`` in a plain ``python script.py``: the request it makes."""
    request = LaunchRequest(nproc_per_node=2, init_timeout=300.0, spawn_default=None)
    outer = detect(SHELL, ["script.py"], hostname="host")
    plan = make_plan(request, outer, SHELL, run_id_fallback="run-id")
    return Layout(plan, ["--call", str(tmp / "call.pickle")],
                  EngineOptions(prog="unirank Parallel"), SHELL)


def recorded(name: str) -> dict[str, str]:
    env: dict[str, str] = json.loads((RECORDED / name).read_text())
    return {**SHELL, **env}


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    """A socket listening on a free port, as the engine opens for the store."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock


def environments(layout: Layout, tmp: Path, sock: socket.socket) -> dict[str, Any]:
    """Every worker's command line and complete environment, as the engine starts them."""
    plan = layout.plan
    store_fd = None
    if plan.hosts_store:
        plan = plan.with_port(int(sock.getsockname()[1]))
        store_fd = sock.fileno()
    launches = attempt_launches(plan, worker_command(layout.target, "python3"), layout.base,
                                layout.options, 0, str(tmp / "attempt_0"), store_fd, False,
                                state_memory=str(tmp / "state"))
    workers = []
    for launch in launches:
        read, write = os.pipe()
        try:
            env = launch.environ(linger_fd=read if launch.hosts_store else None,
                                 done_fd=None if launch.hosts_store else write,
                                 started=STARTED)
        finally:
            os.close(read)
            os.close(write)
        workers.append({"rank": launch.rank,
                        "argv": [arg.replace(str(tmp), "<tmp>") for arg in launch.argv],
                        "environ": stable(env, tmp, plan)})
    return {"node": plan.node_name, "workers": workers}


def stable(env: dict[str, str], tmp: Path, plan: Plan) -> dict[str, str]:
    """``env`` with the values that change from run to run replaced by placeholders."""
    out = {}
    for name, value in sorted(env.items()):
        if name in CHANGING and not (name == "MASTER_PORT" and not plan.hosts_store):
            value = CHANGING[name]
        out[name] = value.replace(str(tmp), "<tmp>")
    return out


def check_golden(name: str, data: dict[str, Any]) -> None:
    path = GOLDEN / f"{name}.json"
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if os.environ.get("UNIRANK_REGEN_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with UNIRANK_REGEN_GOLDEN=1"
    assert json.loads(text) == json.loads(path.read_text()), (
        f"the workers' environment changed; if deliberate, regenerate {path} with "
        "UNIRANK_REGEN_GOLDEN=1 and review the diff")


def test_one_node_two_workers(tmp_path: Path, listening: socket.socket) -> None:
    """``unirank run -n 2 --timeline --tag-output train.py --lr 1``."""
    layout = run_layout(["-n", "2", "--timeline", "--tag-output", "train.py", "--lr", "1"],
                        SHELL)
    check_golden("run_n2", environments(layout, tmp_path, listening))


@pytest.mark.parametrize("rank", [0, 1])
def test_two_nodes_two_workers_under_srun(tmp_path: Path, listening: socket.socket,
                                          rank: int) -> None:
    """``srun -N2 --ntasks-per-node=1 unirank run -n 2 train.py``, on each node."""
    base = recorded(f"srun_N2_npn1_rank{rank}.json")
    layout = run_layout(["-n", "2", "train.py"], base)
    check_golden(f"srun_N2_run_n2_node{rank}", environments(layout, tmp_path, listening))


def test_uneven_srun_tasks_each_one_rank(tmp_path: Path, listening: socket.socket) -> None:
    """``srun -N2 -n3 unirank run train.py`` on node2: srun placed ranks 0-1 on node1 and rank
    2 here, and the worker is told so (UNIRANK_RANKS_PER_NODE=2,1)."""
    base = recorded("srun_N2_n3_rank2.json")
    layout = run_layout(["train.py"], base)
    check_golden("srun_N2_n3_run_node2", environments(layout, tmp_path, listening))


def test_no_python(tmp_path: Path, listening: socket.socket) -> None:
    """``unirank run -n 2 --no-python hostname -s``."""
    layout = run_layout(["-n", "2", "--no-python", "hostname", "-s"], SHELL)
    check_golden("run_n2_no_python", environments(layout, tmp_path, listening))


def test_parallel_spawn(tmp_path: Path, listening: socket.socket) -> None:
    """``with Parallel(nproc_per_node=2) as p: p.run(fn)`` in ``python script.py``."""
    check_golden("parallel_n2", environments(parallel_layout(tmp_path), tmp_path, listening))


def test_dynamic_rendezvous_second_node(tmp_path: Path, listening: socket.socket) -> None:
    """``unirank run --nnodes 1:3 -n 2 --rdzv-backend c10d --rdzv-endpoint node0:29400
    --rdzv-id job7 train.py`` on the node the rendezvous made node rank 1 of 2, after a node
    of 3 workers: ranks 3-4 of 5 (UNIRANK_RANKS_PER_NODE=3,2), GROUP_RANK 1, node 0's master,
    TORCHELASTIC_RUN_ID job7."""
    assignment = Assignment(node_rank=1, nnodes=2, ranks_per_node=(3, 2),
                            hosts=("node0", "host"), master_addr="node0", master_port=41000)
    layout = run_layout(["--nnodes", "1:3", "-n", "2", "--rdzv-backend", "c10d",
                         "--rdzv-endpoint", "node0:29400", "--rdzv-id", "job7", "train.py"],
                        SHELL, assignment)
    check_golden("rdzv_1to3_n2_node1", environments(layout, tmp_path, listening))


def test_golden_files_are_complete() -> None:
    """Every golden file holds whole environments (PATH included) and no run-specific value."""
    files = sorted(GOLDEN.glob("*.json"))
    assert len(files) == 7
    for path in files:
        text = path.read_text()
        assert str(os.getpid()) not in json.dumps(
            [w["environ"].get("UNIRANK_SUPERVISOR_PID") for w in json.loads(text)["workers"]])
        for worker in json.loads(text)["workers"]:
            assert worker["environ"]["PATH"] == SHELL["PATH"]
            assert worker["environ"]["RANK"] == str(worker["rank"])


def test_numa_binding_reaches_each_worker_with_its_local_numbers(tmp_path: Path,
                                                                  listening: socket.socket) -> None:
    """``--numa-binding`` (checked against the machine in the CLI) travels as the mode and the
    supervisor's own local rank and count, which ``--virtual-local-rank`` does not change."""
    layout = run_layout(["-n", "2", "--virtual-local-rank", "train.py"], SHELL)
    layout = replace(layout, options=replace(layout.options, numa_binding="exclusive"))
    workers = environments(layout, tmp_path, listening)["workers"]
    assert [w["environ"]["LOCAL_RANK"] for w in workers] == ["0", "0"]
    assert [w["environ"]["UNIRANK_NUMA_BINDING"] for w in workers] == ["exclusive 0/2",
                                                                       "exclusive 1/2"]
