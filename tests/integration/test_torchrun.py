"""The deprecated ``torch.distributed.launch --use_env`` (torch 2.13 still ships it), one node.

tests/examples covers plain ``torchrun`` and ``torch.distributed.launch`` without ``--use_env``
(which passes ``--local-rank=N``); with ``--use_env`` the rank comes from LOCAL_RANK only. A free
port is passed as ``--master_port``; the example must report exactly that master.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _outputs import (
    EXAMPLES,
    PY,
    check_world,
    parse_reduce,
    run_local,
)

from _procs import free_port

pytestmark = pytest.mark.integration

HOST = socket.gethostname()


def test_torch_distributed_launch_use_env_reduction() -> None:
    port = free_port()
    result = run_local([
        PY, "-m", "torch.distributed.launch", "--use_env", "--nproc_per_node", "2",
        "--master_port", str(port), str(EXAMPLES / "reduction.py"), "--backend", "gloo",
    ])
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    lines = parse_reduce(result.stdout)
    check_world(lines, 2, addr="127.0.0.1", port=port, nodes=[HOST] * 2, reduced=True,
                context=out)
