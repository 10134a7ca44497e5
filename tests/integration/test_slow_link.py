"""A node whose link is slow is named while the job runs (unirank.supervisor.rdzv.linkrule):
three nodes of ``unirank run --nnodes 3`` in network namespaces of their own (root), each rank
all-reducing 16 MiB over gloo without pause (about 5 Gbit/s a node here); once they train,
node 3's link is cut to 100 Mbit/s (``tc ... tbf``: the kernel has no netem). The rendezvous's
server (node 1) says which node, from the kernel's round trip of each node's connection to
it: nothing before the cut, node 3 after it; every node's ``unirank run`` says it, and on node
2 ``unirank top`` and the workers' ``ur.elastic_state().slow_link`` name it too. (Cut to 500
Mbit/s, a tenth, node 3 was named in every run but one pinned to one core, where gloo on one
core moved less than that: the link was not what slowed the job. 100 Mbit/s is below what the
job moves however loaded.)

Environment variables read: the caller's environment, from which launcher variables are removed
(see ``tests/_procs.py``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _netns import IFNAME, Net, address, require

from _procs import launcher_free_environ, unavailable

pytestmark = pytest.mark.integration

PORT = 29611
TIMEOUT = 60.0

# All-reduces of 16 MiB for ever, until the file SHARED/stop exists; SHARED/ready.<rank> once
# ten ran; then what ur.elastic_state() says of a slow link.
TRAIN = """
import os, sys
import torch
import torch.distributed as dist
import unirank as ur

shared = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
data, stop, count = torch.ones(4 << 20), torch.zeros(1), 0
while not stop.item():
    dist.all_reduce(data)
    count += 1
    if count == 10:
        open(os.path.join(shared, f"ready.{rank}"), "w").close()
    stop.fill_(float(rank == 0 and os.path.exists(os.path.join(shared, "stop"))))
    dist.all_reduce(stop)
print(f"node {os.environ['NODE']} slow link {ur.elastic_state().slow_link!r}", flush=True)
dist.destroy_process_group()
"""


def _until(check: Any, what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout  # a bound for a failure, not a measure
    while not check():
        assert time.monotonic() < deadline, f"{what} within {timeout:g} s"
        time.sleep(0.2)


def test_a_node_whose_link_is_cut_to_a_tenth_is_named_by_the_rendezvous(tmp_path: Path) -> None:
    require()
    if shutil.which("tc") is None:
        unavailable("the slow link needs tc (iproute2)")
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    logs = [tmp_path / f"node{n}.log" for n in (1, 2, 3)]
    with Net(3) as net:
        procs: list[subprocess.Popen[Any]] = []
        for node, log in zip(net.nodes, logs, strict=True):
            tmp = tmp_path / f"tmp{node}"
            tmp.mkdir()
            env = launcher_free_environ({"TMPDIR": str(tmp), "GLOO_SOCKET_IFNAME": IFNAME,
                                         "NODE": str(node)})
            with log.open("wb") as out:
                procs.append(net.popen(node, [
                    sys.executable, "-m", "unirank", "run", "--nnodes", "3",
                    "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                    f"{address(1)}:{PORT}", "--rdzv-id", "link", "--local-addr",
                    address(node), str(script), str(tmp_path)], env=env, stdout=out,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        _until(lambda: all((tmp_path / f"ready.{r}").exists() for r in range(3)),
               "every rank all-reduced ten times")
        assert "slow link" not in logs[0].read_text()  # nothing to name yet
        cut = net.run(3, ["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                          "100mbit", "burst", "256kbit", "latency", "400ms"], timeout=30)
        assert cut.returncode == 0, cut.stderr
        _until(lambda: "slow link: node " in logs[0].read_text(), "node 1 named the slow link")
        top = [sys.executable, "-m", "unirank", "top", "--job", "link", "--count", "1", "--json"]
        env2 = launcher_free_environ({"TMPDIR": str(tmp_path / "tmp2")})
        _until(lambda: json.loads(net.run(2, top, timeout=60, env=env2).stdout or "{}").get(
            "slow_link") == f"vm ({address(3)})", "unirank top on node 2 named the slow link")
        (tmp_path / "stop").touch()
        for proc in procs:
            proc.wait(timeout=TIMEOUT)
    said = [line for line in logs[0].read_text().splitlines()
            if line.startswith("unirank run: slow link")]
    assert said and said[0].startswith(f"unirank run: slow link: node vm ({address(3)}): "
                                       "its messages to the rendezvous take "), said
    assert all(p.returncode == 0 for p in procs), [log.read_text()[-2000:] for log in logs]
    assert said == [line for line in logs[1].read_text().splitlines()
                    if line.startswith("unirank run: slow link")]
    assert f"node 2 slow link 'vm ({address(3)})'" in logs[1].read_text().splitlines()
