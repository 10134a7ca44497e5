"""One rank's facts, gathered once (:func:`gather`) for the pure checks of
:mod:`~unirank.doctor.checks` and :mod:`~unirank.doctor.groupchecks`.

No torch import: torch's version comes from the installed distribution's metadata and its CUDA
build from ``torch/version.py``, read as text (importing torch costs about 2 s).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os
import platform
import re
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from unirank import netroute
from unirank.distenv import DistEnv
from unirank.doctor import netinfo
from unirank.doctor.netinfo import Lookup
from unirank.errors import ConfigError
from unirank.gpus import VISIBLE_DEVICES_VAR, gpus_bound_per_task, visible_gpu_count
from unirank.launchers import slurm_vars as V
from unirank.store import uses_agent_store

__all__ = ["Facts", "Versions", "expected_world", "gather", "versions"]

#: variables that say how many tasks a launcher started, in the order they are trusted
_TASK_COUNTS = (V.STEP_NUM_TASKS[0], "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")


@dataclass(frozen=True)
class Versions:
    """The versions every rank must share, and torch's build."""

    python: str
    unirank: str
    torch: str | None
    torch_cuda: str | None


@dataclass(frozen=True)
class Facts:
    """What one rank knows before any network is used; see :func:`gather` for each field."""

    env: DistEnv | None
    env_error: ConfigError | None
    backend: str
    spawn: int | None
    gpus: int
    cuda_visible: str | None
    expected_tasks: tuple[str, int] | None
    master: Lookup | None
    serves: bool
    agent_store: bool
    port_free: bool | None
    port_owner: str | None
    ephemeral: tuple[int, int] | None
    probe: str | None
    interfaces: Mapping[str, tuple[str, ...]]
    route_ip: str | None
    ifname_vars: Mapping[str, str] = field(default_factory=dict)
    port_picked: bool = False
    reverse: tuple[Lookup, ...] = ()
    versions: Versions | None = None
    node: str = ""
    per_task_gpus: bool = False


def versions() -> Versions:
    """Python's, unirank's and torch's versions, and the CUDA version torch was built with."""
    from unirank import __version__

    try:
        torch_version: str | None = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    return Versions(platform.python_version(), __version__, torch_version, _torch_cuda())


def _torch_cuda() -> str | None:
    """``torch.version.cuda``, read from ``torch/version.py`` without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(next(iter(spec.submodule_search_locations)), "version.py")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return None
    match = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return match.group(1) if match else None


def expected_world(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """``(variable, count)``: how many tasks the launcher says it started, where it says so
    (inside an srun step, mpirun), for comparing with the detected world size.

    Reads: SLURM_STEP_ID / SLURM_STEPID, SLURM_STEP_NUM_TASKS, OMPI_COMM_WORLD_SIZE, PMI_SIZE,
    PMIX_SIZE.
    """
    for name in _TASK_COUNTS:
        if name == V.STEP_NUM_TASKS[0] and V.step_id(environ)[0] is None:
            continue
        value = environ.get(name, "").strip()
        if value.isdigit():
            return name, int(value)
    return None


def _detect(environ: Mapping[str, str]) -> tuple[DistEnv | None, ConfigError | None]:
    from unirank.launchers import detect

    try:
        return detect(environ, sys.argv[1:]), None
    except ConfigError as exc:
        return None, exc


def _reverse_queries(ip: str | None) -> tuple[str, ...]:
    """The master's address, and its IPv4-mapped IPv6 form for an IPv4 one (how a dual-stack
    store sees an IPv4 peer)."""
    if not ip:
        return ()
    return (ip,) if ":" in ip else (ip, f"::ffff:{ip}")


def _with_master(env: DistEnv, master: tuple[str, int, str]) -> DistEnv:
    """``env`` with the master (address, port, where the address came from) of the ranks the
    doctor lays out itself."""
    addr, port, source = master
    return dataclasses.replace(env, master_addr=addr, master_port=port,
                               sources={**env.sources, "master_addr": source})


def gather(environ: Mapping[str, str], *, backend: str, spawn: int | None,
           serves: bool | None = None, master: tuple[str, int, str] | None = None,
           port_picked: bool = False) -> Facts:
    """This rank's facts. ``serves``: whether this process would serve the store on the master
    port (default: rank 0 on the master's host), so that the port must be free here.
    ``master``: the address, port and address source the ranks will use, where the doctor
    starts them itself (``-n``: its plan's, so that the rows check what the group uses);
    default: the detected launcher's. ``port_picked``: that port was picked free just now (as
    the engine picks one for a single node), so its range does not matter.

    Reads: the launcher's variables (through :func:`unirank.launchers.detect`),
    CUDA_VISIBLE_DEVICES, SLURM_GPUS_PER_TASK, SLURMD_TRES_BIND, NCCL_SOCKET_IFNAME,
    GLOO_SOCKET_IFNAME, SLURM_STEP_ID and the task counts of :func:`expected_world`.
    """
    env, error = _detect(environ)
    if env is not None and master is not None:
        env = _with_master(env, master)
    ifaces = netroute.interfaces()
    lookup = netinfo.resolve(env.master_addr) if env and env.master_addr else None
    ip = lookup.answer[0] if lookup and lookup.answer else None
    is_local = ip is not None and netroute.is_own(ip, ifaces)
    if serves is None:
        serves = bool(env and env.rank == 0 and is_local and not uses_agent_store(environ))
    port = env.master_port if env else None
    free = netinfo.port_free(port) if serves and port else None
    reverse = tuple(netinfo.reverse_lookup(query) for query in _reverse_queries(ip))
    return Facts(
        env=env, env_error=error, backend=backend, spawn=spawn,
        gpus=visible_gpu_count(environ), cuda_visible=environ.get(VISIBLE_DEVICES_VAR),
        per_task_gpus=gpus_bound_per_task(environ),
        expected_tasks=expected_world(environ), master=lookup,
        serves=serves, agent_store=uses_agent_store(environ), port_free=free,
        port_owner=netinfo.port_owner(port) if free is False and port else None,
        ephemeral=netinfo.ephemeral_range(),
        probe=netinfo.connect_probe(ip, port) if ip and port and not is_local else None,
        interfaces=ifaces, route_ip=netroute.route_source(ip) if ip else None,
        ifname_vars={k: environ[k] for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
                     if environ.get(k)},
        reverse=reverse, versions=versions(), port_picked=port_picked,
        node=env.node_name if env and env.node_name else socket.gethostname(),
    )


def now() -> float:
    """This host's wall clock (for the clock-skew check)."""
    return time.time()
