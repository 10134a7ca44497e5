"""10,000 bad inputs thrown at a running two-node job's rendezvous (no secret: what a process
that knows only the endpoint and the default id can send): malformed, truncated, oversized,
slow and out-of-order messages, half-open connections, evictions, redirects and hellos under the
nodes' own identities (``tests/integration/_rdzv_fuzz.py``). The job goes on at its world size,
restarts nothing and ends 0. Real ``unirank run`` nodes on loopback aliases.

Environment variables read: the caller's environment, from which launcher variables are removed
(see ``tests/_procs.py``).
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from _rdzv_fuzz import throw

from _procs import Runner, free_port

pytestmark = pytest.mark.integration

TIMEOUT = 120.0
ENDPOINT, OTHER = "127.0.1.2", "127.0.1.1"
COUNT = 10_000

TRAIN = """
import os, sys, time
import torch
import torch.distributed as dist

stop, fifo = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
step = 0
while True:
    flag = torch.tensor([float(os.path.exists(stop))])
    dist.all_reduce(flag)
    if flag.item() > 0:
        break
    step += 1
    if step == 3 and dist.get_rank() == 0:
        with open(fifo, "w") as ready:
            ready.write("ready\\n")
    time.sleep(0.02)  # a pace, not a synchronisation
print(f"done rank {dist.get_rank()} world {dist.get_world_size()} "
      f"restart {os.environ['TORCHELASTIC_RESTART_COUNT']}", flush=True)
dist.destroy_process_group()
"""


def _node(runner: Runner, port: int, addr: str, name: str,
          target: list[str]) -> subprocess.Popen[Any]:
    args = ["--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{ENDPOINT}:{port}", "--rdzv-conf",
            "join_timeout=60,last_call_timeout=10", "--local-addr", addr, *target]
    return runner.start(args, text=True, env={"UNIRANK_NODE_NAME": name},
                        drop=("OMP_NUM_THREADS",))


def test_ten_thousand_bad_inputs_leave_the_job_untouched(runner: Runner,
                                                         tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    stop, fifo = tmp_path / "stop", tmp_path / "ready.fifo"
    os.mkfifo(fifo)
    port = free_port()
    target = [str(tmp_path / "train.py"), str(stop), str(fifo)]
    nodes = [_node(runner, port, ENDPOINT, "nodeA", target),
             _node(runner, port, OTHER, "nodeB", target)]
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert select.select([reader], [], [], TIMEOUT)[0], "the job did not train"
    finally:
        os.close(reader)
    sent = throw(ENDPOINT, port, COUNT, seed=41)
    stop.touch()
    ended = [node.communicate(timeout=TIMEOUT) for node in nodes]
    said = "".join(out + err for out, err in ended)
    assert [node.returncode for node in nodes] == [0, 0], said
    assert sorted(line for out, _err in ended for line in out.splitlines()
                  if line.startswith("done ")) == \
        ["done rank 0 world 2 restart 0", "done rank 1 world 2 restart 0"], said
    assert "rendezvous round 1" not in said and " is lost" not in said, said
    assert sum(sent.values()) == COUNT and len(sent) >= 15, sent
