"""The dynamic rendezvous's keys (:mod:`unirank.supervisor.rdzv.agent`), in the one style. Not
used by the agent yet: the rendezvous is being rebuilt (issue 35), and takes its keys from here
when it lands; until then its own (``unirank.rdzv.job``, ...) are the ones in use."""

from __future__ import annotations

__all__ = ["JOB_KEY", "beat_key", "claim_key", "node_record_key"]

#: the run id of the job this rendezvous serves (a node of another job is refused)
JOB_KEY = "unirank/rdzv/job"


def claim_key(run_id: str, addr: str) -> str:
    """A node's claim to its place (one ``unirank run`` per node address)."""
    return f"unirank/rdzv/{run_id}/node/{addr}"


def beat_key(run_id: str, addr: str) -> str:
    """A node's beats (a counter it adds to)."""
    return f"{claim_key(run_id, addr)}/beat"


def node_record_key(rank: int) -> str:
    """Node ``rank``'s record in a round."""
    return f"unirank/rdzv/node/{rank}"
