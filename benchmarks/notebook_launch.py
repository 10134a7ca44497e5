"""Start-up of ``ur.launch(fn, nproc_per_node=2)`` against HF Accelerate's ``notebook_launcher``
with the same function, both called in one real Jupyter kernel (ipykernel), as a notebook does.

    python3 benchmarks/notebook_launch.py [--repeat N]

Needs the test extra (``pip install -e '.[test]'``: ipykernel, nbclient's jupyter_client,
cloudpickle, accelerate); CI does not run it. The function, defined in a cell, starts a gloo
group if none is started (``ur.launch`` starts one for it; Accelerate's workers get torchrun's
variables and start their own), all_reduces one tensor and returns it. Each launcher is timed
from its call to its return (workers started, group made, function run, workers ended), in
alternation, ``--repeat`` times; the medians and their ratio are printed. The first round is
included: a notebook's first launch is what a user waits for too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

KERNEL = "unirank-bench-python"

SETUP = """
import os, socket, time, torch, torch.distributed as dist, unirank as ur
from accelerate import notebook_launcher

def work(*_):
    started_here = not dist.is_initialized()
    if started_here:
        dist.init_process_group("gloo")
    value = torch.ones(1)
    dist.all_reduce(value)
    if started_here:
        dist.destroy_process_group()
    return value.item()

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])

def timed(name):
    start = time.perf_counter()
    if name == "unirank":
        assert ur.launch(work, nproc_per_node=2, backend="gloo") == [2.0, 2.0]
    else:
        notebook_launcher(work, (), num_processes=2, use_port=free_port())
    return time.perf_counter() - start
"""


def kernel_manager(folder: Path):  # type: ignore[no-untyped-def]
    """A kernel manager for this interpreter's ipykernel."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec = folder / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "unirank bench", "language": "python"}))
    return KernelManager(kernel_name=KERNEL,
                         kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(folder)]))


def run_cell(client, code: str) -> str:  # type: ignore[no-untyped-def]
    """Execute ``code``; its stdout (fails on an error)."""
    msg_id = client.execute(code)
    out = ""
    while True:
        message = client.get_iopub_msg(timeout=600)
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = message["msg_type"], message["content"]
        if kind == "stream" and content["name"] == "stdout":
            out += content["text"]
        elif kind == "error":
            raise RuntimeError("\n".join(content["traceback"]))
        elif kind == "status" and content["execution_state"] == "idle":
            return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    repeat = parser.parse_args().repeat
    with tempfile.TemporaryDirectory() as tmp:
        manager = kernel_manager(Path(tmp))
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("MASTER_", "RANK", "LOCAL_", "WORLD_", "UNIRANK_"))}
        manager.start_kernel(env=env)
        client = manager.client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=120)
            run_cell(client, SETUP)
            times: dict[str, list[float]] = {"unirank": [], "accelerate": []}
            for _ in range(repeat):
                for name in times:
                    line = run_cell(client, f"print('TIME', timed({name!r}))")
                    times[name].append(float(line.split("TIME", 1)[1].split()[0]))
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name, ts in times.items():
        print(f"{name:<11} median {med[name]:.3f} s  runs {' '.join(f'{t:.3f}' for t in ts)}")
    print(f"ur.launch / notebook_launcher, nproc 2, one kernel: "
          f"{med['unirank'] / med['accelerate']:.3f}x (medians of {repeat}; load average "
          f"{os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    start = time.time()
    main()
    print(f"({time.time() - start:.0f} s in all)")
