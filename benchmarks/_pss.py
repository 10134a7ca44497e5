"""Proportional set size (PSS) of a launched job's processes, read while its workers hold still.

The job runs ``_pss_worker.py``: each worker, after ``init_process_group`` and a barrier,
connects to a Unix socket of ours, sends its pid and waits until we close the connection. The
connection's peer credentials give the worker's pid (checked against the one it sends); the
workers' common parent is the fork server (``unirank run``) or the agent (``torchrun``); every
other process of the launched tree (``unirank run``'s supervisor) is counted as ``launcher``.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
PSS_WORKER = str(HERE / "_pss_worker.py")
#: how long we wait for the workers to report (a job that failed would otherwise hang us)
ACCEPT_TIMEOUT = 300.0


def pss_kib(pid: int) -> int:
    """The ``Pss:`` line of ``/proc/PID/smaps_rollup``, in KiB."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    raise RuntimeError(f"no Pss line in /proc/{pid}/smaps_rollup")


def parent_pid(pid: int) -> int:
    """The parent's pid, from ``/proc/PID/stat`` (after the command name, which may hold spaces)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def descendants(root: int) -> set[int]:
    """Every live process below ``root`` (not ``root`` itself)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                children.setdefault(parent_pid(int(entry.name)), []).append(int(entry.name))
            except (OSError, ValueError):
                continue  # ended while we looked
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def accept_worker(server: socket.socket) -> tuple[int, socket.socket]:
    """One worker's connection and its pid (peer credentials, checked against what it sent)."""
    conn, _ = server.accept()
    conn.settimeout(ACCEPT_TIMEOUT)
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid = struct.unpack("3i", creds)[0]
    sent = b""
    while not sent.endswith(b"\n"):
        chunk = conn.recv(64)
        if not chunk:
            raise RuntimeError(f"worker {pid} closed before sending its pid")
        sent += chunk
    if int(sent) != pid:
        raise RuntimeError(f"worker sent pid {int(sent)}, its socket says {pid}")
    return pid, conn


def measure(launcher: int, workers: Sequence[int]) -> dict[str, int]:
    """PSS (KiB) of the workers, their parent, and the rest of the launched tree (``launcher``)."""
    parents = {parent_pid(pid) for pid in workers}
    if len(parents) != 1:
        raise RuntimeError(f"workers have several parents: {sorted(parents)}")
    parent = parents.pop()
    tree = descendants(launcher) | {launcher}
    if parent not in tree:
        raise RuntimeError(f"the workers' parent {parent} is not under the launcher {launcher}")
    rest = tree - set(workers) - {parent}
    return {
        "workers": sum(pss_kib(pid) for pid in workers),
        "parent": pss_kib(parent),
        "launcher": sum(pss_kib(pid) for pid in rest),
        "processes": len(tree),
    }


def job_pss(cmd: Sequence[str], n: int, env: Mapping[str, str]) -> dict[str, int]:
    """Start ``cmd`` (which runs ``n`` workers of ``_pss_worker.py``) and measure it when held."""
    with tempfile.TemporaryDirectory() as tmp, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        path = os.path.join(tmp, "hold.sock")
        server.bind(path)
        server.listen(n)
        server.settimeout(ACCEPT_TIMEOUT)
        proc = subprocess.Popen(cmd, env={**env, "UNIRANK_BENCH_SOCKET": path},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        conns: list[socket.socket] = []
        try:
            held = [accept_worker(server) for _ in range(n)]
            conns = [conn for _, conn in held]
            sample = measure(proc.pid, [pid for pid, _ in held])
        except BaseException:
            proc.kill()
            raise
        finally:
            for conn in conns:
                conn.close()
            code = proc.wait(timeout=ACCEPT_TIMEOUT)
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {code}")
    return sample
