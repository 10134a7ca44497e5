"""What every launcher module shares: the detection context and master resolution."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from unirank.contract import node_name as contract_node_name
from unirank.rendezvous import derive_port, explicit_master

__all__ = ["Context", "Master", "node_name", "resolve_master"]


def _read_text(path: str) -> str:
    return Path(path).read_text()


@dataclass(frozen=True)
class Context:
    """Inputs of detection besides the environment.

    ``argv`` is the process's command line (torch.distributed.launch passes ``--local-rank``);
    ``read_text`` reads a file that a variable names (LSB_DJOB_RANKFILE, PBS_NODEFILE): tests pass
    a dict lookup; ``hostname`` is this machine's name, used when no launcher names the node.
    """

    argv: Sequence[str] = ()
    read_text: Callable[[str], str] = _read_text
    hostname: str = "localhost"


@dataclass(frozen=True)
class Master:
    """The rendezvous host and port, and where each came from."""

    addr: str | None
    port: int | None
    addr_source: str
    port_source: str


def resolve_master(
    environ: Mapping[str, str],
    *,
    hosts: Sequence[str] = (),
    hosts_source: str = "",
    single_node: bool = False,
    job_id: str | None = None,
    step_id: str | None = None,
    job_source: str = "",
) -> Master:
    """Master address and port by unirank's rules (see :mod:`unirank.rendezvous`).

    Reads: MASTER_ADDR, MASTER_PORT.
    """
    addr, port = explicit_master(environ)
    addr_source = "MASTER_ADDR"
    if addr is None:
        if hosts:
            addr, addr_source = hosts[0], f"first host of {hosts_source}"
        elif single_node:
            addr, addr_source = "127.0.0.1", "default: whole world on one node"
        else:
            addr_source = "unknown: set MASTER_ADDR"
    port_source = "MASTER_PORT"
    if port is None:
        port = derive_port(job_id, step_id)
        port_source = f"derived from {job_source}" if job_id else "default 29500"
    return Master(addr, port, addr_source, port_source)


def node_name(environ: Mapping[str, str], ctx: Context) -> tuple[str, str]:
    """This node's name and where it came from (:func:`unirank.contract.node_name`).

    Reads: SLURMD_NODENAME.
    """
    return contract_node_name(environ, ctx.hostname)
