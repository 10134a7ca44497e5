"""``--numa-binding``: which CPUs each local rank is bound to, from the machine's topology.

torchrun's four modes (torch 2.9+), by local rank. A rank's *home* NUMA node is the node of
the GPU it uses (:func:`unirank.gpus.device_index`; the GPU's node is read from
``/sys/bus/pci/devices/<address>/numa_node``); a rank that uses no GPU gets the nodes in blocks
by local rank (ranks 0-3 of 8 on node 0 and 4-7 on node 1 of a two-node machine). The ranks
sharing a home are its *peers*, ordered by local rank.

* ``node``: every CPU of the home node;
* ``socket``: every CPU of every node on the home node's socket;
* ``exclusive``: the home node's physical cores divided evenly among the peers (the lowest
  peers get one more when they do not divide), each core with all its hardware threads;
* ``core-complex``: one group of cores sharing the last-level cache on the home node, the
  peers taking the largest groups in turn.

Only the CPUs this process may use (``sched_getaffinity``) count, so a cgroup or ``taskset``
limit is kept. A machine with one NUMA node has nothing to bind: :func:`check_binding` refuses
it in one line, as it does an unknown mode.

Pure: every function takes the sysfs root (``/sys``) and the allowed CPUs, so tests give them a
tree of files. Reads no environment variable.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from unirank.errors import ConfigError

__all__ = ["MODES", "OPTION", "Topology", "binding_cpus", "check_binding", "format_cpus",
           "home_nodes", "parse_cpus", "read_topology"]

#: torchrun's modes, in its order
MODES = ("node", "socket", "exclusive", "core-complex")
#: the command-line option this module's refusals name
OPTION = "--numa-binding"


@dataclass(frozen=True)
class Topology:
    """The CPUs this process may use, by NUMA node, with what each CPU shares."""

    #: NUMA node -> its allowed CPUs
    nodes: dict[int, frozenset[int]]
    #: CPU -> its socket (physical package)
    socket_of: dict[int, int]
    #: CPU -> the lowest CPU of its physical core (the core's name)
    core_of: dict[int, int]
    #: CPU -> the lowest CPU sharing its last-level cache (the cache's name)
    cache_of: dict[int, int]


def parse_cpus(text: str) -> frozenset[int]:
    """``0-3,8,10-11`` (sysfs's list format) as a set of CPUs."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return frozenset(cpus)


def format_cpus(cpus: Iterable[int]) -> str:
    """A set of CPUs in sysfs's list format, ``0-3,8``."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][-1] + 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None


def _last_cache_group(cpu_dir: str, cpu: int) -> frozenset[int]:
    """The CPUs sharing ``cpu``'s highest-level cache (itself alone where sysfs has none)."""
    best_level, best = -1, frozenset({cpu})
    cache_dir = os.path.join(cpu_dir, "cache")
    for index in sorted(os.listdir(cache_dir)) if os.path.isdir(cache_dir) else []:
        level = _read(os.path.join(cache_dir, index, "level"))
        shared = _read(os.path.join(cache_dir, index, "shared_cpu_list"))
        if level is not None and shared and int(level) > best_level:
            best_level, best = int(level), parse_cpus(shared)
    return best


def read_topology(root: str = "/sys", allowed: Iterable[int] | None = None) -> Topology:
    """The machine's NUMA nodes and CPUs under the sysfs ``root``, limited to ``allowed``
    (default: this process's ``sched_getaffinity``)."""
    allowed_set = frozenset(os.sched_getaffinity(0) if allowed is None else allowed)
    node_root = os.path.join(root, "devices/system/node")
    nodes: dict[int, frozenset[int]] = {}
    for name in os.listdir(node_root) if os.path.isdir(node_root) else []:
        text = _read(os.path.join(node_root, name, "cpulist"))
        if name.startswith("node") and name[4:].isdigit() and text is not None:
            cpus = parse_cpus(text) & allowed_set
            if cpus:
                nodes[int(name[4:])] = cpus
    if not nodes:  # no NUMA information: one node of every allowed CPU
        nodes = {0: allowed_set}
    socket_of, core_of, cache_of = {}, {}, {}
    for cpu in sorted(allowed_set):
        cpu_dir = os.path.join(root, f"devices/system/cpu/cpu{cpu}")
        socket_of[cpu] = int(_read(os.path.join(cpu_dir, "topology/physical_package_id")) or 0)
        siblings = _read(os.path.join(cpu_dir, "topology/thread_siblings_list"))
        core_of[cpu] = min(parse_cpus(siblings) if siblings else {cpu})
        cache_of[cpu] = min(_last_cache_group(cpu_dir, cpu))
    return Topology(nodes=dict(sorted(nodes.items())), socket_of=socket_of, core_of=core_of,
                    cache_of=cache_of)


def check_binding(mode: str, topology: Topology) -> None:
    """Refuse (:class:`ConfigError` on ``--numa-binding``) an unknown mode, or any mode on a
    machine whose allowed CPUs sit on one NUMA node."""
    if mode not in MODES:
        raise ConfigError("unknown NUMA binding", variable=OPTION, value=mode,
                          hint=f"use one of {', '.join(MODES)}")
    if len(topology.nodes) < 2:
        cpus = format_cpus(next(iter(topology.nodes.values()), ()))
        raise ConfigError(f"this machine has one NUMA node (CPUs {cpus}): there is nothing "
                          "to bind", variable=OPTION, value=mode, hint="leave the option out")


def home_nodes(topology: Topology, local_world_size: int,
               gpu_nodes: Sequence[int] | None = None) -> list[int]:
    """Each local rank's home NUMA node: ``gpu_nodes[local_rank]`` (the node of the GPU that
    rank uses) where given, else the nodes in blocks by local rank."""
    if gpu_nodes is not None:
        return [node if node in topology.nodes else min(topology.nodes) for node in gpu_nodes]
    order = list(topology.nodes)
    return [order[rank * len(order) // local_world_size] for rank in range(local_world_size)]


def _grouped(cpus: Iterable[int], key: dict[int, int]) -> list[frozenset[int]]:
    groups: dict[int, set[int]] = {}
    for cpu in sorted(cpus):
        groups.setdefault(key[cpu], set()).add(cpu)
    return [frozenset(groups[name]) for name in sorted(groups)]


def _exclusive(cores: list[frozenset[int]], peer: int, peers: int, node: int) -> frozenset[int]:
    share, extra = divmod(len(cores), peers)
    if share < 1:
        raise ConfigError(f"NUMA node {node} has {len(cores)} physical cores for {peers} "
                          "ranks", variable=OPTION, value="exclusive",
                          hint="use --numa-binding node, or fewer ranks per node")
    start = peer * share + min(peer, extra)
    end = start + share + (1 if peer < extra else 0)
    return frozenset().union(*cores[start:end])


def binding_cpus(mode: str, topology: Topology, local_rank: int,
                 homes: Sequence[int]) -> frozenset[int]:
    """The CPUs ``local_rank`` is bound to under ``mode``, given every local rank's home."""
    check_binding(mode, topology)
    home = homes[local_rank]
    node_cpus = topology.nodes[home]
    if mode == "node":
        return node_cpus
    if mode == "socket":
        socket = topology.socket_of[min(node_cpus)]
        return frozenset(cpu for cpus in topology.nodes.values() for cpu in cpus
                         if topology.socket_of[cpu] == socket)
    peers = [rank for rank, node in enumerate(homes) if node == home]
    peer = peers.index(local_rank)
    if mode == "exclusive":
        return _exclusive(_grouped(node_cpus, topology.core_of), peer, len(peers), home)
    caches = sorted(_grouped(node_cpus, topology.cache_of), key=lambda g: (-len(g), min(g)))
    return caches[peer % len(caches)]
