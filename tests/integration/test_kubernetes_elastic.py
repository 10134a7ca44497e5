"""The elastic PyTorchJob of examples/kubernetes/pytorchjob-elastic.yaml (``PET_NNODES=1:2``,
c10d at ``train-worker-0:23456``, 2 workers per pod) in simulated pods (tests/integration/
_pods.py's :class:`~_pods.Cluster`; no Kubernetes cluster can run here): a pod deleted (its
whole tree SIGKILLed, as after the grace period) and started again with the same name and
variables. The training script checkpoints every step; the test follows its rounds through a
FIFO (no sleeps as synchronisation)."""

from __future__ import annotations

import os
import select
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _outputs import JOB_ENV
from _pods import Cluster, Pod, injected, manifest
from test_kubernetes import _need_namespaces

pytestmark = pytest.mark.integration
TIMEOUT = 120.0

# Each step all-reduces a one; rank 0 saves the step it finished (atomically) and an attempt
# starts after the saved step. Rank 0 writes "w<world>" to the FIFO at its second step of each
# attempt. An attempt that resumed at a world of 4 ends after 5 steps.
TRAIN = """
import os, sys, time
import torch
import torch.distributed as dist

fifo = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
start = torch.load("ckpt.pt")["step"] + 1 if os.path.exists("ckpt.pt") else 0
print(f"resume {start} rank {rank} world {world}", flush=True)
step = start
while True:
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"step {step} rank {rank} world {world} sum {int(t.item())}", flush=True)
    if rank == 0:
        torch.save({"step": step}, "ckpt.tmp")
        os.replace("ckpt.tmp", "ckpt.pt")
        if step == start + 1:
            with open(fifo, "w") as out:
                out.write(f"w{world}")
    if start > 0 and world == 4 and step >= start + 5:
        break
    step += 1
    time.sleep(0.05)
dist.destroy_process_group()
"""


class Rounds:
    """What rank 0 wrote to the FIFO (held open for reading from the start)."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.keep = os.open(path, os.O_WRONLY)
        self.text = ""

    def wait(self, word: str, count: int) -> None:
        while self.text.count(word) < count:
            ready, _, _ = select.select([self.reader], [], [], TIMEOUT)
            assert ready, f"no {word!r} x{count} within {TIMEOUT:g} s: {self.text!r}"
            self.text += os.read(self.reader, 4096).decode()

    def close(self) -> None:
        os.close(self.reader)
        os.close(self.keep)


def _resumes(log: str) -> list[tuple[int, int]]:
    """(step resumed at, world) of each attempt in a pod's log (its workers say it alike)."""
    found = [(int(w[1]), int(w[5])) for w in (line.split() for line in log.splitlines())
             if len(w) == 6 and w[0] == "resume"]
    return [r for i, r in enumerate(found) if i == 0 or found[i - 1] != r]


def _elastic_pods(tmp_path: Path) -> tuple[Rounds, list[Pod], dict[str, str]]:
    """The elastic PyTorchJob's pods, each told the rounds FIFO, the FIFO, and the environment
    every pod adds (the job's variables, this interpreter's bin first on PATH)."""
    _need_namespaces()
    (tmp_path / "train.py").write_text(TRAIN)
    rounds = Rounds(tmp_path / "rounds.fifo")
    pods = [p.__class__(p.name, p.environ, [*p.command, str(tmp_path / "rounds.fifo")])
            for p in injected(manifest("pytorchjob-elastic.yaml"))]
    bindir = str(Path(sys.executable).parent)
    extra = {**JOB_ENV, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    return rounds, pods, extra


@pytest.mark.parametrize("killed", [1, 0])
def test_a_deleted_pod_started_again_rejoins(tmp_path: Path, killed: int) -> None:
    """Both pods meet (world 4); pod ``killed`` is deleted: the other goes on alone (world 2)
    from its checkpoint; the pod started again with the same name and variables rejoins, the
    world is 4 again, resumed from the checkpoint, and both pods end 0."""
    rounds, pods, extra = _elastic_pods(tmp_path)
    survivor = 1 - killed
    try:
        with Cluster(pods, tmp_path, extra=extra) as cluster:
            cluster.start(0)
            cluster.start(1)
            rounds.wait("w4", 1)
            cluster.kill(killed, TIMEOUT)
            rounds.wait("w2", 1)
            again = cluster.start(killed)
            codes = (cluster.running[survivor].wait(TIMEOUT), again.wait(TIMEOUT))
            logs = cluster.log(survivor, 0), cluster.log(killed, 1)
    finally:
        rounds.close()
    out = "\n".join(logs)
    assert codes == (0, 0), out
    resumes = _resumes(logs[0])
    assert [w for _, w in resumes] == [4, 2, 4], out
    assert 0 == resumes[0][0] < resumes[1][0] < resumes[2][0], out
    assert "1 node waiting to join" in logs[0], out
    assert {line.split(" world ")[1].split()[0] for line in logs[1].splitlines()
            if line.startswith("step ")} == {"4"}, out


@pytest.mark.parametrize("address", ["same", "new"])
def test_a_replaced_pod_0_joins_the_running_job(tmp_path: Path, address: str) -> None:
    """Each pod in a network namespace of its own (as in Kubernetes: no pod can serve on
    another's address). Pod 0 (``train-worker-0``, the rendezvous endpoint) is deleted: pod 1
    takes the rendezvous over on its own address and trains alone. Pod 0 started again with
    its original variables, at the same address or at a new one its name now resolves to,
    finds nothing at the endpoint and serves a fresh rendezvous there; the running pod's server
    probes the endpoint and redirects it (rounds.follows): it joins the running job (it never
    trains alone: no second job), the world is 4 again and both pods end 0."""
    rounds, pods, extra = _elastic_pods(tmp_path)
    try:
        with Cluster(pods, tmp_path, extra=extra, own_network=True) as cluster:
            cluster.start(0)
            cluster.start(1)
            rounds.wait("w4", 1)
            cluster.kill(0, TIMEOUT)
            rounds.wait("w2", 1)
            again = cluster.start(0, None if address == "same" else "198.18.0.3")
            codes = (cluster.running[1].wait(TIMEOUT), again.wait(TIMEOUT))
            logs = cluster.log(1, 0), cluster.log(0, 1)
    finally:
        rounds.close()
    out = "\n".join(logs)
    assert codes == (0, 0), out
    assert [w for _, w in _resumes(logs[0])] == [4, 2, 4], out
    assert "unirank run: store moved to node " in logs[0], out
    # told it either way: its server followed before its agent's hello (it joins at once),
    # or after (the agent follows it)
    assert (": the job runs there" in logs[1]
            or "unirank run: this node waits to join: the job " in logs[1]), out
    assert {line.split(" world ")[1].split()[0] for line in logs[1].splitlines()
            if line.startswith("step ")} == {"4"}, out
