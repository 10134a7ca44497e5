"""What one node brings to the dynamic rendezvous and what it gets back (pure; no torch).

:class:`RdzvSpec` is what the ``unirank run`` parent asks of its helper (:mod:`.agent`);
:class:`NodeRecord` is what each node publishes once torch's rendezvous completed;
:func:`assign` is THE order of the nodes: the node that serves the rendezvous store (it runs on
the endpoint's host) first, then the others in torch's rank order, so that node rank 0 (where
global rank 0 and its store run) is the endpoint's host wherever that host takes part.
Messages between the parent and the helper are one JSON object per line (:func:`to_line`,
:func:`assignment_of`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, is_dataclass

from unirank.errors import ConfigError
from unirank.supervisor.rdzv import conf

__all__ = ["DEFAULT_ENDPOINT_PORT", "Assignment", "NodeRecord", "RdzvSpec", "assign",
           "assignment_of", "node_blocks", "to_line"]

#: torchrun's port for a c10d endpoint given without one
DEFAULT_ENDPOINT_PORT = 29400


@dataclass(frozen=True)
class RdzvSpec:
    """One node's part in the rendezvous (``--rdzv-*``, ``--nnodes MIN:MAX``, ``-n``)."""

    endpoint_host: str
    endpoint_port: int
    run_id: str
    min_nodes: int
    max_nodes: int
    #: this node's address in the rendezvous: ``--local-addr``, else its name
    local_addr: str
    #: this node's name (the workers' UNIRANK_NODE_NAME)
    node_name: str
    #: the workers this node starts
    nproc: int
    #: whether this node is on the endpoint's host, so serves the rendezvous store there
    serves_endpoint: bool
    #: the port of the store this node's rank 0 serves, should this node be node rank 0
    store_port: int = 0
    #: torchrun's ``--rdzv-conf`` keys, in seconds / counts (:class:`~.conf.RdzvConf`)
    join_timeout: float = conf.RdzvConf.join_timeout
    last_call_timeout: float = conf.RdzvConf.last_call_timeout
    close_timeout: float = conf.RdzvConf.close_timeout
    keep_alive_interval: float = conf.RdzvConf.keep_alive_interval
    keep_alive_max_attempt: int = conf.RdzvConf.keep_alive_max_attempt
    #: ``local_addr`` was given (``--local-addr``): the same one twice is one node started twice
    explicit_addr: bool = False
    #: the job's rendezvous secret ("": none; :mod:`.secret`), never shown
    secret: str = field(default="", repr=False)

    @property
    def lost_after(self) -> float:
        """Seconds of silence after which a node is lost (:func:`.conf.lost_after`)."""
        return conf.lost_after(self.keep_alive_interval, self.keep_alive_max_attempt)

    @property
    def fence_after(self) -> float:
        """Seconds of silence from its server after which a node fences itself
        (:func:`.conf.fence_after`)."""
        return conf.fence_after(self.keep_alive_interval, self.keep_alive_max_attempt)

    @property
    def successor_hold(self) -> float:
        """Seconds a successor waits before its first round (:func:`.conf.successor_hold`)."""
        return conf.successor_hold(self.keep_alive_interval, self.keep_alive_max_attempt)

    @property
    def reconnect_within(self) -> float:
        """Seconds a node gives the server it goes to (:func:`.conf.reconnect_within`)."""
        return conf.reconnect_within(self.keep_alive_interval, self.keep_alive_max_attempt)

    @property
    def resume_grace(self) -> float:
        """Seconds a successor counts the last round's nodes alive
        (:func:`.conf.resume_grace`)."""
        return conf.resume_grace(self.keep_alive_interval, self.keep_alive_max_attempt)

    def master_addr(self) -> str:
        """Where this node's rank 0 would serve the workers' store."""
        return self.endpoint_host if self.serves_endpoint else self.local_addr


@dataclass(frozen=True)
class NodeRecord:
    """What a node publishes to the others once torch's rendezvous completed."""

    addr: str
    name: str
    nproc: int
    store_port: int
    serves_endpoint: bool
    #: the node's identity in the rendezvous (host, pid and a random part)
    claim: str = ""
    #: the port where this node would serve the rendezvous, should it take it over
    rdzv_port: int = 0
    #: the address the server sees this node's connection come from, and its unirank run's
    #: pid (the server fills them in: :mod:`.names` tells nodes of one name apart by them)
    seen_addr: str = ""
    pid: int = 0


@dataclass(frozen=True)
class Assignment:
    """This node's place after a rendezvous: its node rank, the node count, the ranks on each
    node (in node-rank order), the nodes' names and the workers' master."""

    node_rank: int
    nnodes: int
    ranks_per_node: tuple[int, ...]
    hosts: tuple[str, ...]
    master_addr: str
    master_port: int
    round: int = 0
    #: the nodes' identities in the rendezvous, in node-rank order
    nodes: tuple[str, ...] = ()
    #: the nodes' real addresses and unirank run pids, in node-rank order (:mod:`.names`)
    addrs: tuple[str, ...] = ()
    pids: tuple[int, ...] = ()

    def named(self) -> dict[str, dict[str, object]]:
        """Its nodes for :func:`.names.node_label`, by identity."""
        count = len(self.nodes)
        addrs = self.addrs if len(self.addrs) == count else ("",) * count
        pids = self.pids if len(self.pids) == count else (0,) * count
        return {node: {"name": name, "addr": addr, "pid": pid} for node, name, addr, pid in
                zip(self.nodes, self.hosts, addrs, pids)}

    def nodes_of(self, ranks: Sequence[int]) -> tuple[str, ...]:
        """The identities of the nodes that run ``ranks`` (global ranks, node after node)."""
        return tuple(node for node, block in zip(self.nodes, node_blocks(self.ranks_per_node))
                     if any(rank in block for rank in ranks))


def node_blocks(ranks_per_node: Sequence[int]) -> list[range]:
    """Each node's global ranks, node after node (THE layout: a node's ranks are consecutive,
    in node-rank order), from how many each node runs."""
    blocks, first = [], 0
    for count in ranks_per_node:
        blocks.append(range(first, first + count))
        first += count
    return blocks


def assign(records: Sequence[NodeRecord], own: int, round_: int = 0) -> Assignment:
    """Node ranks from torch's ranks: ``records[r]`` is what torch's rank ``r`` published and
    ``own`` this node's torch rank. The node that serves the endpoint comes first, then the
    others in torch's order; node rank 0's master is its own address and store port."""
    order = sorted(range(len(records)), key=lambda r: (not records[r].serves_endpoint, r))
    first = records[order[0]]
    return Assignment(
        node_rank=order.index(own), nnodes=len(records),
        ranks_per_node=tuple(records[r].nproc for r in order),
        hosts=tuple(records[r].name for r in order),
        master_addr=first.addr, master_port=first.store_port, round=round_,
        nodes=tuple(records[r].claim for r in order),
        addrs=tuple(records[r].seen_addr or records[r].addr for r in order),
        pids=tuple(records[r].pid for r in order),
    )


def to_line(payload: object) -> bytes:
    """One message: a dataclass or a dict as one JSON line."""
    data = asdict(payload) if is_dataclass(payload) and not isinstance(payload, type) \
        else payload
    return (json.dumps(data, sort_keys=True) + "\n").encode()


def assignment_of(line: str, *, where: str) -> Assignment:
    """The helper's answer: an :class:`Assignment`, or its refusal raised as the one-line
    :class:`ConfigError` it carries (``where`` names the helper in a garbled answer's error)."""
    try:
        data = json.loads(line)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ConfigError(f"{where} answered {line.strip()[:200]!r}", variable=None,
                          hint="run again; if it repeats, report it with the line above")
    if "error" in data:
        code = data.get("exit_code")  # this node evicted: exitcodes.EVICTED
        raise ConfigError(str(data["error"]), variable=data.get("variable"),
                          value=data.get("value"), hint=str(data.get("hint") or ""),
                          exit_code=code if isinstance(code, int) else None)
    data["ranks_per_node"] = tuple(data["ranks_per_node"])
    data["hosts"] = tuple(data["hosts"])
    data["nodes"] = tuple(data.get("nodes") or ())
    data["addrs"] = tuple(data.get("addrs") or ())
    data["pids"] = tuple(data.get("pids") or ())
    return Assignment(**data)
