"""torchrun's ``PET_*`` variables with real processes: two "pods" given only Kubeflow Trainer
v2's variables run the bare ``unirank run x.py`` and form one world of 4 on loopback (as two
torchruns do; checked by hand with torch 2.13), and the command line wins over them.

Environment variables read: the caller's environment, from which launcher variables (PET_*
too) are removed (:func:`_procs.launcher_free_environ`).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from _procs import Runner, free_port

pytestmark = pytest.mark.integration

ALL_REDUCE = """
import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print("W", os.environ["RANK"], os.environ["WORLD_SIZE"], int(t.item()), flush=True)
dist.destroy_process_group()
"""


def test_two_pods_with_only_kubeflow_s_pet_variables_form_one_world(runner: Runner,
                                                                     tmp_path: Path) -> None:
    runner.script("x.py", ALL_REDUCE)
    port = str(free_port())
    pods = [runner.start(["x.py"], text=True, env={
        "PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": str(rank),
        "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": port}) for rank in (0, 1)]
    seen = []
    for rank, pod in enumerate(pods):
        try:
            out, err = pod.communicate(timeout=runner.timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"pod {rank} did not end in {runner.timeout:g} s")
        assert pod.returncode == 0, err
        assert f"--node-rank {rank} (PET_NODE_RANK)" in err.splitlines()[0]
        seen += re.findall(r"^W (\d) (\d) (\d)$", out, re.M)
    assert sorted(seen) == [(str(r), "4", "4") for r in range(4)]


def test_the_command_line_wins_over_pet_nproc_per_node(runner: Runner) -> None:
    runner.script("x.py", "import os\nprint('RANK', os.environ['RANK'], flush=True)\n")
    result = runner.run(["--nproc-per-node", "1", "x.py"], env={"PET_NPROC_PER_NODE": "3"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["RANK", "0"]
