"""Why an attempt ended, as the next attempt's workers learn it: :func:`restart_reason` (pure:
the attempt's :class:`~.summary.RunResult` and the plans before and after in, a
:class:`~unirank.elasticstate.RestartReason` out). :mod:`.attempts` passes it on through the
worker environment (UNIRANK_RESTART_REASON, :func:`~.workerenv.worker_environ`).

Runs in the ``unirank run`` parent; reads no environment variable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from unirank.elasticstate import RestartReason, nodes_changed
from unirank.exitcodes import HANG_TIMEOUT
from unirank.exitcodes import REQUEUE as REQUEUE_EXIT_CODE
from unirank.supervisor.plan import Plan
from unirank.supervisor.rdzv.messages import EVICTED, MOVED
from unirank.supervisor.rdzv.spec import node_blocks
from unirank.supervisor.summary import RunResult

__all__ = ["evicted_node_ranks", "evicted_ranks", "evicted_why", "is_slow", "nothing_to_evict",
           "restart_reason"]


def is_slow(verdict: Mapping[str, Any] | None) -> bool:
    """Whether ``verdict`` is ``--on-slow evict``'s (:func:`unirank.hang.slowcost.
    slow_verdict`), not a hang's."""
    return bool((verdict or {}).get("slow"))


def evicted_ranks(verdict: Mapping[str, Any] | None) -> list[int]:
    """The ranks whose nodes a verdict leaves out: a hang's that never entered its collective
    (``--on-hang evict``), or the straggler's node's (``--on-slow evict``)."""
    key = "slow" if is_slow(verdict) else "never_entered"
    return [int(r) for r in (verdict or {}).get(key) or ()]


def evicted_node_ranks(verdict: Mapping[str, Any] | None,
                       ranks_per_node: Sequence[int]) -> list[int]:
    """Every rank of the nodes a verdict leaves out (those of :func:`evicted_ranks`), the
    nodes' ranks counted by ``ranks_per_node``; the verdict's ranks alone where that is not
    known (empty)."""
    ranks = evicted_ranks(verdict)
    if not ranks_per_node:
        return ranks
    return [r for block in node_blocks(ranks_per_node) if any(x in block for x in ranks)
            for r in block]


def evicted_why(verdict: Mapping[str, Any] | None) -> str:
    """Why the nodes a ``verdict`` names are stopped: a hang's (rank 0's
    :func:`unirank.hang.detect.verdict`): ``node evicted: rank 1 never entered all_reduce
    #12``; a straggler's (:func:`unirank.hang.slowcost.slow_verdict`): ``node evicted: rank 1
    kept the others waiting 80 % of the time``; "" where it names no rank."""
    if is_slow(verdict):
        share = float((verdict or {}).get("share") or 0.0)
        return (f"node evicted: rank {(verdict or {}).get('straggler')} kept the others "
                f"waiting {share * 100:.0f} % of the time")
    ranks = evicted_ranks(verdict)
    if not ranks:
        return ""
    call = str((verdict or {}).get("call") or "the collective")
    return "node evicted: " + "; ".join(f"rank {rank} never entered {call}" for rank in ranks)


def nothing_to_evict(verdict: Mapping[str, Any] | None) -> str:
    """Why ``--on-hang evict`` ends the job instead of restarting it into the same hang: a
    hang ``verdict`` (:func:`unirank.hang.detect.verdict`) that names no stuck rank
    (``--on-hang evict: nothing to evict: no rank is stuck, every rank waits: rank 1 called
    another collective or shape than the others; the job ends``); "" where it names ranks to
    evict, or where there is no verdict (the attempt did not end at the hang timeout, or rank
    0's node could not write it)."""
    if not verdict or evicted_ranks(verdict):
        return ""
    from unirank.hang.detect import AHEAD, ENDED, MISMATCH
    from unirank.joincheck import format_ranks

    ranks = [int(r) for r in verdict.get("blamed") or ()]
    who = format_ranks(ranks) if ranks else "no rank"
    call = str(verdict.get("call") or "the collective")
    why = {MISMATCH: f"no rank is stuck, every rank waits: {who} called another collective "
                     "or shape than the others",
           ENDED: f"{who} ended {'its' if len(ranks) == 1 else 'their'} program before "
                  f"{call}",
           AHEAD: f"no rank is stuck: {who} went on past {call}"}
    said = why.get(str(verdict.get("blame")), f"no rank is stuck in {call}")
    return f"--on-hang evict: nothing to evict: {said}; the job ends"


def restart_reason(result: RunResult, before: Plan, after: Plan, evicted: str = "",
                   moved: str | None = None) -> RestartReason:
    """Why the attempt that gave ``result`` (run at ``before``) ended, the next one running at
    ``after``: the world changed (a node lost or joined: the nodes by name, from the two
    rounds' node lists; also where a worker here failed for its lost peers and nodes were gone
    at the next round), the workers stopped to be requeued, the hang timeout ended them, or
    a worker failed (the root cause's rank, node and exit code). ``evicted``: why this node
    evicted nodes (:func:`evicted_why` of the hang verdict it read): where nodes left, or the
    hang timeout ended the attempt (a spare took the evicted node's place), that is
    the reason, whichever way the attempt ended (the evicted node's worker may have ended
    first, or its node asked for a new round). ``moved``: the news that the rendezvous moved
    meanwhile (its node lost: ``store moved to node ...``), the reason where no eviction is
    (also where a worker here failed first, on its lost peers)."""
    lost, joined = nodes_changed(before.hosts, after.hosts)
    first = result.first_failure
    hang_ended = first is not None and first.own_exit_code == HANG_TIMEOUT
    # the evicted node's place may go to a spare of the same name: no name left then
    if evicted and (lost or hang_ended):
        return RestartReason("node evicted", evicted, lost, joined)
    if first is None and result.world_changed and result.world_change_kind == EVICTED:
        return RestartReason("node evicted", str(result.world_changed), lost, joined)
    if moved and lost:
        return RestartReason("store moved", moved, lost, joined)
    if lost and first is not None and first.lost_peer:
        # the workers here lost their peers on a node that is gone: that node is the cause
        return RestartReason("node lost", f"rank {first.rank} on {first.node} lost its peers "
                             f"({first.error}); gone at the next round: {', '.join(lost)}",
                             lost, joined)
    if first is None and result.world_changed:
        kind = ("store moved" if result.world_change_kind == MOVED
                else "node lost" if lost else "node joined" if joined else "world changed")
        return RestartReason(kind, result.world_changed, lost, joined)
    if first is None and result.requeued:
        return RestartReason("requeued", f"the workers stopped to be requeued (exit code "
                             f"{REQUEUE_EXIT_CODE})", lost, joined)
    if first is None:
        return RestartReason("unknown", f"the attempt ended with exit code {result.exit_code}",
                             lost, joined)
    code = first.own_exit_code
    kind = "hang timeout" if code == HANG_TIMEOUT else "worker failed"
    if kind == "hang timeout" and lost:  # --on-hang evict: the stuck ranks' nodes were left out
        return RestartReason("node evicted", f"node evicted: {', '.join(lost)} ({first.error})",
                             lost, joined, rank=first.rank, exit_code=code, node=first.node)
    message = f"rank {first.rank} on {first.node}: {first.describe()}"
    if first.error:
        message += f": {first.error}"
    return RestartReason(kind, message, lost, joined, rank=first.rank, exit_code=code,
                         node=first.node)
