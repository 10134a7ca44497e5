"""Start-up over ssh: ``unirank run --hosts node1:2,node2:2`` / DeepSpeed's way (one
``ssh HOST torchrun --nnodes 2 --node_rank I ...`` per host, started in parallel, as its pdsh
and openmpi runners do), the same two hosts, the same hello script (gloo init, one all_reduce).

Needs the testbed's sshds (``scripts/testbed start``: node1 127.0.1.1, node2 127.0.1.2) and its
ssh config ``/etc/unirank-testbed/ssh/config``; skipped (with a line) when they are missing.
Both commands get the same environment, ``PYTHONPATH`` carried to the hosts.
"""

from __future__ import annotations

import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = sys.executable
HELLO = str(HERE / "_hello_worker.py")
SSH_CONFIG = "/etc/unirank-testbed/ssh/config"
HOSTS = ("node1", "node2")
TIMEOUT_S = 120


def _env() -> dict[str, str]:
    prefixes = ("SLURM", "OMPI", "PMI", "PMIX", "RANK", "LOCAL_", "WORLD_SIZE", "GROUP_",
                "MASTER_", "TORCHELASTIC", "UNIRANK")
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.1.1", 0))
        return int(s.getsockname()[1])


def _unirank() -> float:
    cmd = [PY, "-m", "unirank", "run", "--hosts", ",".join(f"{h}:2" for h in HOSTS),
           "--ssh-option", f"-F {SSH_CONFIG}", HELLO]
    start = time.perf_counter()
    subprocess.run(cmd, env=_env(), check=True, timeout=TIMEOUT_S, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _deepspeed_way() -> float:
    port = _free_port()
    env = _env()
    path = f"env PYTHONPATH={shlex.quote(env['PYTHONPATH'])} " if "PYTHONPATH" in env else ""
    start = time.perf_counter()
    procs = []
    for rank, host in enumerate(HOSTS):
        remote = (f"cd {shlex.quote(os.getcwd())} && {path}{shlex.quote(PY)} -m "
                  f"torch.distributed.run --nnodes {len(HOSTS)} --node_rank {rank} "
                  f"--nproc_per_node 2 --master_addr {HOSTS[0]} --master_port {port} "
                  f"{shlex.quote(HELLO)}")
        procs.append(subprocess.Popen(["ssh", "-F", SSH_CONFIG, host, remote], env=env,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    codes = [p.wait(timeout=TIMEOUT_S) for p in procs]
    elapsed = time.perf_counter() - start
    if any(codes):
        raise RuntimeError(f"ssh torchrun failed: exit codes {codes}")
    return elapsed


def available() -> str | None:
    """Why the benchmark cannot run here, or None."""
    if not Path(SSH_CONFIG).exists():
        return f"{SSH_CONFIG} is missing: run scripts/testbed start (root)"
    for host in HOSTS:
        done = subprocess.run(["ssh", "-F", SSH_CONFIG, host, "true"], timeout=30,
                              stdin=subprocess.DEVNULL, capture_output=True, check=False)
        if done.returncode != 0:
            return f"ssh {host} fails: {done.stderr.decode(errors='replace').strip()}"
    return None


def bench_ssh(repeat: int) -> bool:
    why = available()
    if why is not None:
        print(f"ssh: skipped: {why}")
        return True
    times: dict[str, list[float]] = {"unirank": [], "deepspeed": []}
    for _ in range(repeat):
        times["unirank"].append(_unirank())
        times["deepspeed"].append(_deepspeed_way())
    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"ssh: unirank run --hosts node1:2,node2:2 {med['unirank']:.3f}s, one ssh torchrun "
          f"per host (DeepSpeed's way) {med['deepspeed']:.3f}s (medians of {repeat})")
    print(f"  {'unirank run --hosts / ssh + torchrun per host':<52} "
          f"{med['unirank'] / med['deepspeed']:8.3f}x  (no target)")
    return True
