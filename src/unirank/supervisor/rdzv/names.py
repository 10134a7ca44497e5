"""How a node of the dynamic rendezvous is named in messages (pure; no torch, no I/O).

Several nodes may share a name: two ``unirank run`` on one host (``vm``, ``vm``), or pods of
one name in different jobs. :func:`node_label` is THE rule, given every node known at the
moment: the node's name, with its address where another node has the same name (or where
``address`` asks for it), and its ``unirank run`` pid where another node has the same name and
address too (two nodes on one host): ``vm``, ``vm (10.0.0.2)``, ``vm (127.0.0.1, pid 4242)``.
The address is the node's real one (where the rendezvous's server sees its connection come
from), never a name looked up again.

Each node is a mapping with ``name``, ``addr`` and ``pid`` (missing: unknown), keyed by its
identity in the rendezvous (:func:`~.agent.node_identity`); :func:`of_records` builds them
from the nodes' records. Reads no environment variable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["node_label", "node_labels", "of_records"]


def node_label(node: str, nodes: Mapping[str, Mapping[str, Any]], *,
               address: bool = False) -> str:
    """How ``node`` (an identity in ``nodes``) is named in a message (see the module)."""
    me = nodes.get(node) or {}
    name, addr, pid = str(me.get("name") or node), str(me.get("addr") or ""), me.get("pid")
    twins = [other for key, other in nodes.items()
             if key != node and str(other.get("name") or key) == name]
    parts = [addr] if addr and (address or twins) else []
    if pid and any(str(other.get("addr") or "") == addr for other in twins):
        parts.append(f"pid {pid}")
    return name + (f" ({', '.join(parts)})" if parts else "")


def node_labels(chosen: Iterable[str], nodes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The labels of the ``chosen`` nodes (identities), sorted."""
    return sorted(node_label(node, nodes) for node in chosen)


def of_records(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The nodes of rendezvous records (:class:`~.spec.NodeRecord` as dicts), by identity:
    the real address the server saw (``seen_addr``), else the published one."""
    return {str(r.get("claim") or r.get("name")): {
        "name": r.get("name"), "addr": r.get("seen_addr") or r.get("addr"), "pid": r.get("pid")}
        for r in records}
