"""Two loopback "nodes" under SkyPilot's variables (as its docs give them; no SkyPilot cluster
runs here): node 0 at 127.0.0.1, node 1 at 127.0.0.2, each with its own SKYPILOT_NODE_RANK and
the same SKYPILOT_NUM_NODES, SKYPILOT_NODE_IPS and SKYPILOT_NUM_GPUS_PER_NODE, and no
MASTER_ADDR. Only MASTER_PORT is given, a free port, so that the test does not depend on 29500
being free on a shared machine."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from _procs import free_port, launcher_free_environ

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _outputs import EXAMPLES, JOB_ENV, PY, check_world, console_script, parse_reduce

pytestmark = pytest.mark.integration

TIMEOUT = 120.0
IPS = ("127.0.0.1", "127.0.0.2")


def sky_environ(node_rank: int, port: int) -> dict[str, str]:
    """What SkyPilot gives node ``node_rank`` of two CPU nodes (and the test's port)."""
    return launcher_free_environ({
        **JOB_ENV,
        "SKYPILOT_NODE_RANK": str(node_rank),
        "SKYPILOT_NUM_NODES": "2",
        "SKYPILOT_NODE_IPS": "\n".join(IPS) + "\n",
        "SKYPILOT_NUM_GPUS_PER_NODE": "0",
        "MASTER_PORT": str(port),
    })


def run_on_both_nodes(command: Sequence[str], cwd: Path) -> str:
    """``command`` on both nodes at once (the same command, as SkyPilot's ``run:``); both must
    end 0. Returns their output together."""
    port = free_port()
    procs = [subprocess.Popen(list(command), cwd=cwd, env=sky_environ(n, port),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              stdin=subprocess.DEVNULL) for n in (0, 1)]
    outs: list[str] = []
    try:
        for proc in procs:
            outs.append(proc.communicate(timeout=TIMEOUT)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    text = "\n".join(outs)
    assert [p.returncode for p in procs] == [0, 0], text
    return text


def test_unirank_run_on_two_nodes_forms_a_world_of_four(tmp_path: Path) -> None:
    out = run_on_both_nodes([PY, "-m", "unirank", "run", "-n", "2",
                             str(EXAMPLES / "reduction.py")], tmp_path)
    check_world(parse_reduce(out), 4, addr="127.0.0.1", nodes=[*IPS[:1] * 2, *IPS[1:] * 2],
                reduced=True, context=out)


def test_plain_python_is_one_rank_per_node(tmp_path: Path) -> None:
    out = run_on_both_nodes([PY, str(EXAMPLES / "reduction.py")], tmp_path)
    check_world(parse_reduce(out), 2, addr="127.0.0.1", nodes=list(IPS), reduced=True,
                context=out)


DOC = Path(__file__).resolve().parents[2] / "docs" / "skypilot.md"
MARK = "<!-- golden: skypilot-task.yaml"


def documented_task() -> tuple[str, list[str]]:
    """The task YAML of docs/skypilot.md and the lines of its ``run:`` block."""
    text = DOC.read_text()
    block = text[text.index(MARK):].split("```yaml\n", 1)[1].split("```", 1)[0]
    lines = block.splitlines()
    at = lines.index("run: |")
    run = [line[2:] for line in lines[at + 1:] if line.startswith("  ")]
    return block, run


def test_documented_task_yaml_is_the_one_tested() -> None:
    block, run = documented_task()
    assert "num_nodes: 2\n" in block
    assert run == ["unirank run train.py"]


def test_documented_run_command_on_two_cpu_nodes(tmp_path: Path) -> None:
    """The ``run:`` command of the docs, verbatim, through bash as SkyPilot runs it; on CPU
    nodes ``auto`` starts one worker per node. ``unirank`` is this interpreter's."""
    (tmp_path / "train.py").write_text((EXAMPLES / "reduction.py").read_text())
    _, run = documented_task()
    bindir = str(Path(console_script("unirank")).parent)
    out = run_on_both_nodes(["bash", "-c", f'PATH="{bindir}:$PATH"; ' + "\n".join(run)],
                            tmp_path)
    check_world(parse_reduce(out), 2, addr="127.0.0.1", nodes=list(IPS), reduced=True,
                context=out)
