"""``ur.launch`` in a real Jupyter kernel (ipykernel): nbclient executes notebooks (the example
notebook, and one whose rank 1 fails), and jupyter_client interrupts a kernel mid-training as a
notebook's stop button does (SIGINT to the kernel).

The kernel is this interpreter's (a kernel spec written for the test), started with the
launcher-free environment. Every wait has a timeout; nothing sleeps.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _procs import children_of, launcher_free_environ, unavailable, wait_gone

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "notebook.ipynb"
KERNEL = "unirank-test-python"
TIMEOUT = 180


@pytest.fixture(scope="module")
def kernel_specs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A kernel spec manager whose one kernel is this interpreter's ipykernel."""
    try:
        import ipykernel  # noqa: F401
        import nbclient  # noqa: F401
        import nbformat  # noqa: F401
        from jupyter_client.kernelspec import KernelSpecManager
    except ImportError as exc:
        unavailable(f"the notebook lane needs nbclient, nbformat and ipykernel ({exc}); "
                    f"pip install -e '.[test]'")
    folder = tmp_path_factory.mktemp("kernels") / KERNEL
    folder.mkdir()
    (folder / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "unirank test", "language": "python"}))
    return KernelSpecManager(kernel_dirs=[str(folder.parent)])


def execute(notebook: Any, specs: Any, cwd: Path) -> Any:
    """Run every cell of ``notebook`` in a fresh kernel; the notebook with its outputs."""
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    manager = KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)
    client = NotebookClient(notebook, km=manager, timeout=TIMEOUT,
                            resources={"metadata": {"path": str(cwd)}})
    try:
        client.execute(env=launcher_free_environ())
    finally:  # nbclient leaves a kernel manager it was given running
        if manager.has_kernel:
            manager.shutdown_kernel(now=True)
    return notebook


def stream_text(cell: Any, name: str = "stdout") -> str:
    return "".join(o["text"] for o in cell.outputs
                   if o["output_type"] == "stream" and o["name"] == name)


def test_the_example_notebook_trains_two_ranks_and_gets_their_values(
        kernel_specs: Any, tmp_path: Path) -> None:
    import nbformat

    notebook = execute(nbformat.read(EXAMPLE, as_version=4), kernel_specs, tmp_path)
    launch_cell = next(c for c in notebook.cells
                       if c.cell_type == "code" and "ur.launch(" in c.source)
    lines = stream_text(launch_cell).splitlines()
    losses = [float(line.rsplit(" ", 1)[1]) for line in lines
              if line.startswith("[rank0]:epoch ")]
    assert len(losses) == 5 and losses[-1] < losses[0]  # print0: rank 0's lines only
    assert not any(line.startswith("[rank1]:epoch") for line in lines)
    assert {"[rank0]:done on cpu", "[rank1]:done on cpu"} <= set(lines)
    result = launch_cell.outputs[-1]["data"]["text/plain"]
    ranks = re.findall(r"\((\d), ([0-9.]+)\)", result)
    assert [r for r, _ in ranks] == ["0", "1"]
    assert ranks[0][1] == ranks[1][1]  # the all_reduced loss, the same on both ranks
    assert stream_text(notebook.cells[-1]) == "True\n"  # DDP kept the weights equal


def test_an_exception_in_rank_1_is_raised_in_the_cell_and_the_next_launch_works(
        kernel_specs: Any, tmp_path: Path) -> None:
    import nbformat

    cells = [
        "import torch, unirank as ur\n"
        "def step(local_rank, fail_on):\n"
        "    if ur.get_rank() == fail_on:\n"
        "        raise ValueError(f'bad batch on rank {fail_on}')\n"
        "    return ur.all_reduce(torch.ones(1)).item()",
        "ur.launch(step, 1, nproc_per_node=2, backend='gloo')",
        "import sys\nerr = sys.last_value\n"
        "print(type(err).__name__, err.rank, type(err.__cause__).__name__)\n"
        "print(err.traceback.splitlines()[-1])",
        "print(ur.launch(step, -1, nproc_per_node=2, backend='gloo'))",
        "with ur.Parallel(backend='gloo', nproc_per_node=2) as p:\n"
        "    print('Parallel', p.run(step, -1))",
    ]
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    notebook.cells[1].metadata["tags"] = ["raises-exception"]
    notebook = execute(notebook, kernel_specs, tmp_path)
    error = next(o for o in notebook.cells[1].outputs if o["output_type"] == "error")
    assert error["ename"] == "WorkerFailedError"
    assert error["evalue"] == ("local rank 1 (rank 1) exited with code 1: "
                               "ValueError: bad batch on rank 1")
    shown = "\n".join(error["traceback"])
    assert "RankTraceback" in shown and "in step" in shown  # rank 1's own traceback
    assert "[rank1]:" in stream_text(notebook.cells[1], "stderr")  # its lines, in the cell
    assert stream_text(notebook.cells[2]).splitlines() == [
        "WorkerFailedError 1 RankTraceback", "ValueError: bad batch on rank 1"]
    assert stream_text(notebook.cells[3]) == "[2.0, 2.0]\n"
    # Parallel.run takes a function of a cell too, and returns the values by local rank
    assert stream_text(notebook.cells[4]) == "Parallel [2.0, 2.0]\n"


@pytest.fixture
def kernel(kernel_specs: Any, tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    """A started kernel and its blocking client."""
    from jupyter_client.manager import KernelManager

    manager = KernelManager(kernel_name=KERNEL, kernel_spec_manager=kernel_specs)
    manager.start_kernel(env=launcher_free_environ(), cwd=str(tmp_path))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=TIMEOUT)
        yield manager, client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def run_until(client: Any, code: str, done: Any) -> tuple[str, str]:
    """Send ``code``; read its output until ``done(text)`` or its end (the kernel idle again);
    its message id and the text (an error's name and value included)."""
    msg_id = client.execute(code)
    text = ""
    deadline = time.monotonic() + TIMEOUT
    while not done(text):
        message = client.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = message["msg_type"], message["content"]
        if kind == "stream":
            text += content["text"]
        elif kind == "error":
            text += f"ERROR {content['ename']}: {content['evalue']}\n"
        elif kind == "status" and content["execution_state"] == "idle":
            break
    return msg_id, text


def reply_to(client: Any, msg_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT
    while True:
        reply = client.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            return dict(reply["content"])


TRAIN_FOREVER = """
import os, torch, unirank as ur
print("kernel", os.getpid(), flush=True)
def train(local_rank):
    print("worker", os.getpid(), flush=True)
    step = 0
    while True:
        ur.all_reduce(torch.ones(1))
        step += 1
        if step == 50:
            print("training", flush=True)
ur.launch(train, nproc_per_node=2, backend="gloo")
"""


def test_the_kernels_interrupt_stops_every_worker_and_the_kernel_goes_on(
        kernel: tuple[Any, Any]) -> None:
    manager, client = kernel
    msg_id, text = run_until(client, TRAIN_FOREVER,
                             lambda t: t.count("]:training") == 2)
    kernel_pid = int(re.search(r"^kernel (\d+)$", text, re.M).group(1))  # type: ignore[union-attr]
    workers = [int(p) for p in re.findall(r"\]:worker (\d+)$", text, re.M)]
    assert len(workers) == 2
    manager.interrupt_kernel()  # the notebook's stop button: SIGINT to the kernel
    reply = reply_to(client, msg_id)
    assert (reply["status"], reply["ename"]) == ("error", "KeyboardInterrupt")
    # launch returned once every worker had ended; what is left is the idle fork server that
    # launch keeps for the next call, with no child
    assert wait_gone(workers, timeout=0.5) == []
    kept = children_of(kernel_pid)
    assert len(kept) == 1, kept
    assert b"unirank.supervisor.fork.server" in Path(f"/proc/{kept[0]}/cmdline").read_bytes()
    assert children_of(kept[0]) == []
    # the kernel is usable: the next launch works
    msg_id, text = run_until(client, "print(ur.launch(lambda r: r + 1, nproc_per_node=2, "
                                     "backend='gloo'))", lambda t: False)
    assert text.splitlines()[-1] == "[1, 2]", text
    assert reply_to(client, msg_id)["status"] == "ok"
