"""Whether to evict a straggler's node (``--on-slow evict|replace``): the rule, pure.

A straggler keeps every other rank waiting a share ``f`` of the time (the ``margin`` of its
:class:`~unirank.hang.straggle.Straggler`): the job then does ``1 - f`` of the work it
could. Without the straggler's node (``k`` of the ``N`` ranks) it does ``(N - k) / N``, with
nobody waiting for that node. Evicting gains ``f - k / N`` of the job's throughput, and costs
a restart: about :data:`RESTART_COST_S` seconds of the whole job (its workers start again and
restore their state). The eviction pays where the gain repays that cost within
:data:`PAYBACK_S`::

    (f - k / N) * PAYBACK_S >= RESTART_COST_S

so, with the defaults, where ``f`` exceeds ``k / N`` by a tenth. Two nodes of one rank each:
a node at half speed (``f`` about 0.5) is kept (without it the job would run at half speed
too), one at a fifth (``f`` about 0.8) is evicted. The node never takes the job below its
fewest nodes (:func:`unirank.contract.on_slow_now` turns ``evict`` off there), and one node
is evicted at a time (the next attempt's detector starts over).

Where a spare waits to join (a node started beyond MAX: it takes the evicted node's place at
the next round), no capacity is lost: the gain is ``f`` itself, and the node goes where
``f * PAYBACK_S >= RESTART_COST_S`` (``f`` of a tenth or more). ``--on-slow replace`` acts
only then; ``evict`` counts a spare where one waits.

Reads no environment variable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the command line reads PAYBACK_S: no import of the straggler rule there
    from unirank.hang.straggle import Straggler

__all__ = ["PAYBACK_S", "RESTART_COST_S", "gain", "node_ranks", "slow_verdict", "to_evict"]

#: seconds of the whole job a restart is taken to cost (its workers started again, their
#: state restored, the first step compiled), for the rule: more than unirank's own recovery
#: (well under a second), since the program's start is the user's
RESTART_COST_S = 60.0
#: the time within which an eviction's gain must repay the restart
PAYBACK_S = 600.0


def gain(share: float, node_ranks_count: int, world_size: int) -> float:
    """The share of the job's throughput an eviction gains (negative: it loses)."""
    return share - node_ranks_count / max(world_size, 1)


def node_ranks(records: Mapping[int, Mapping[str, Any] | None], rank: int) -> list[int]:
    """The ranks on ``rank``'s node by their last progress records: the same node rank
    (``group``, torchrun's GROUP_RANK) where the records carry it, else the same node name
    (two nodes of one host then count as one: never evicted)."""
    own = records.get(rank) or {}
    key, value = ("group", own["group"]) if "group" in own else ("node", own.get("node"))
    found = sorted(r for r, record in records.items()
                   if record is not None and record.get(key) == value)
    return found or [rank]


def to_evict(named: Sequence[Straggler], records: Mapping[int, Mapping[str, Any] | None],
             world_size: int, *, spares: int = 0, only_replaced: bool = False,
             ) -> tuple[Straggler, list[int]] | None:
    """The straggler whose node to evict now and that node's ranks, or None: the one that
    keeps the others waiting most, where evicting its node pays (the module's rule; with
    ``spares`` waiting, no rank is lost) and leaves some rank; ``only_replaced``
    (``--on-slow replace``): only where a spare waits."""
    if only_replaced and spares < 1:
        return None
    for straggler in sorted(named, key=lambda s: -s.margin):
        ranks = node_ranks(records, straggler.rank)
        if len(ranks) >= world_size:
            continue
        lost = 0 if spares > 0 else len(ranks)
        if gain(straggler.margin, lost, world_size) * PAYBACK_S >= RESTART_COST_S:
            return straggler, ranks
    return None


def slow_verdict(straggler: Straggler, ranks: Sequence[int]) -> dict[str, Any]:
    """The verdict every rank writes for the supervisors (as a hang's,
    :func:`unirank.hang.detect.verdict`): ``slow``, the ranks of the node to leave out, and
    the straggler's rank and share, for the line that says why
    (:func:`unirank.supervisor.restartreason.evicted_why`)."""
    return {"slow": sorted(ranks), "straggler": straggler.rank, "share": straggler.margin}
