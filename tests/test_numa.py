"""``--numa-binding``'s CPU choice (:mod:`unirank.numa`) on machines described as sysfs trees.

This machine has one NUMA node, so the multi-node machines here are trees of files in sysfs's
layout (the real part, a machine with several NUMA nodes, cannot run here); the one-node
refusal and the binding itself (``sched_setaffinity``) run for real.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from _procs import Runner, launcher_free_environ
from unirank import numa
from unirank.contract import NUMA_BINDING_VAR
from unirank.errors import ConfigError


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def make_sysfs(root: Path, *, sockets: int, nodes_per_socket: int, cores_per_node: int,
               threads: int = 2, cores_per_cache: int = 2) -> Path:
    """A machine: CPU ``c`` of hardware thread ``t`` on core ``k`` is ``t * cores + k`` (Linux's
    usual numbering, siblings far apart); each node has its cores in cache groups."""
    cores = sockets * nodes_per_socket * cores_per_node
    for core in range(cores):
        node, socket = core // cores_per_node, core // (cores_per_node * nodes_per_socket)
        siblings = [t * cores + core for t in range(threads)]
        first = core - core % cores_per_cache
        cache = [t * cores + c for t in range(threads)
                 for c in range(first, first + cores_per_cache)]
        for cpu in siblings:
            cpu_dir = root / f"devices/system/cpu/cpu{cpu}"
            _write(cpu_dir / "topology/physical_package_id", str(socket))
            _write(cpu_dir / "topology/thread_siblings_list", numa.format_cpus(siblings))
            _write(cpu_dir / "cache/index0/level", "1")
            _write(cpu_dir / "cache/index0/shared_cpu_list", numa.format_cpus(siblings))
            _write(cpu_dir / "cache/index3/level", "3")
            _write(cpu_dir / "cache/index3/shared_cpu_list", numa.format_cpus(cache))
    for node in range(sockets * nodes_per_socket):
        own = [t * cores + c for t in range(threads)
               for c in range(node * cores_per_node, (node + 1) * cores_per_node)]
        _write(root / f"devices/system/node/node{node}/cpulist", numa.format_cpus(own))
    return root


@pytest.fixture
def two_sockets(tmp_path: Path) -> numa.Topology:
    """2 sockets x 2 NUMA nodes x 4 cores x 2 threads: CPUs 0-31, node 0 = 0-3,16-19."""
    root = make_sysfs(tmp_path, sockets=2, nodes_per_socket=2, cores_per_node=4)
    return numa.read_topology(str(root), allowed=range(32))


def test_cpu_lists_round_trip() -> None:
    assert numa.parse_cpus("0-3,8,10-11\n") == frozenset({0, 1, 2, 3, 8, 10, 11})
    assert numa.format_cpus({11, 0, 1, 2, 3, 8, 10}) == "0-3,8,10-11"
    assert numa.format_cpus(()) == ""


def test_topology_names_nodes_sockets_cores_and_caches(two_sockets: numa.Topology) -> None:
    assert numa.format_cpus(two_sockets.nodes[0]) == "0-3,16-19"
    assert numa.format_cpus(two_sockets.nodes[3]) == "12-15,28-31"
    assert two_sockets.socket_of[16] == 0 and two_sockets.socket_of[8] == 1
    assert two_sockets.core_of[17] == 1
    assert two_sockets.cache_of[19] == 2


def test_allowed_cpus_limit_the_nodes(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, sockets=1, nodes_per_socket=2, cores_per_node=2)
    topology = numa.read_topology(str(root), allowed={0, 1, 4})
    assert topology.nodes == {0: frozenset({0, 1, 4})}


def test_ranks_without_gpus_take_the_nodes_in_blocks(two_sockets: numa.Topology) -> None:
    assert numa.home_nodes(two_sockets, 8) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert numa.home_nodes(two_sockets, 2) == [0, 2]
    assert numa.home_nodes(two_sockets, 4, gpu_nodes=[1, 1, 3, 9]) == [1, 1, 3, 0]


@pytest.mark.parametrize(("mode", "local_rank", "expected"), [
    ("node", 1, "0-3,16-19"),
    ("node", 2, "4-7,20-23"),
    ("socket", 0, "0-7,16-23"),
    ("socket", 7, "8-15,24-31"),
    ("exclusive", 0, "0-1,16-17"),
    ("exclusive", 1, "2-3,18-19"),
    ("core-complex", 0, "0-1,16-17"),
    ("core-complex", 1, "2-3,18-19"),
])
def test_each_mode_binds_as_torchrun_describes(two_sockets: numa.Topology, mode: str,
                                               local_rank: int, expected: str) -> None:
    homes = numa.home_nodes(two_sockets, 8)
    assert numa.format_cpus(numa.binding_cpus(mode, two_sockets, local_rank, homes)) == expected


def test_exclusive_gives_the_lowest_peers_the_extra_core(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, sockets=1, nodes_per_socket=2, cores_per_node=5, threads=1)
    topology = numa.read_topology(str(root), allowed=range(10))
    homes = [0, 0, 1, 1]
    shares = [numa.format_cpus(numa.binding_cpus("exclusive", topology, r, homes))
              for r in range(4)]
    assert shares == ["0-2", "3-4", "5-7", "8-9"]


def test_core_complexes_are_shared_in_turn_when_ranks_outnumber_them(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, sockets=1, nodes_per_socket=2, cores_per_node=4, threads=1)
    topology = numa.read_topology(str(root), allowed=range(8))
    homes = [0, 0, 0]
    chosen = [numa.format_cpus(numa.binding_cpus("core-complex", topology, r, homes))
              for r in range(3)]
    assert chosen == ["0-1", "2-3", "0-1"]


def test_exclusive_refuses_more_ranks_than_cores(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, sockets=1, nodes_per_socket=2, cores_per_node=1, threads=1)
    topology = numa.read_topology(str(root), allowed=range(2))
    with pytest.raises(ConfigError, match="NUMA node 0 has 1 physical cores for 2 ranks"):
        numa.binding_cpus("exclusive", topology, 0, [0, 0])


def test_unknown_mode_and_one_node_are_refused(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, sockets=1, nodes_per_socket=1, cores_per_node=2)
    one_node = numa.read_topology(str(root), allowed=range(4))
    with pytest.raises(ConfigError, match="one NUMA node"):
        numa.check_binding("node", one_node)
    with pytest.raises(ConfigError, match="use one of node, socket, exclusive, core-complex"):
        numa.check_binding("nodes", one_node)


def test_run_refuses_binding_on_this_one_node_machine(runner: Runner) -> None:
    """This machine has one NUMA node: one line, exit 2, no worker started."""
    if len(numa.read_topology().nodes) > 1:
        pytest.skip("this machine has several NUMA nodes")
    runner.script("hello.py", "print('started')\n")
    proc = runner.run(["-n", "2", "--numa-binding", "node", "hello.py"], timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--numa-binding='node': this machine has one NUMA node" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "started" not in proc.stdout


def test_worker_binds_itself(tmp_path: Path) -> None:
    """The worker's binding is a real sched_setaffinity (CPU 1 as its own NUMA node here)."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs")
    first, second = allowed[:2]
    for node, cpu in enumerate((first, second)):
        _write(tmp_path / f"devices/system/node/node{node}/cpulist", str(cpu))
    code = ("import os, sys; from unirank.supervisor.worker.numabind import bind; "
            f"cpus = bind(os.environ, sys_root={str(tmp_path)!r}); "
            "print(sorted(cpus), sorted(os.sched_getaffinity(0)))")
    env = launcher_free_environ()
    env[NUMA_BINDING_VAR] = "node 1/2"
    env["CUDA_VISIBLE_DEVICES"] = ""
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == f"[{second}] [{second}]"
