"""Whether this run was restarted, and why: :class:`ElasticState` (what
:func:`unirank.elastic_state` answers) and :class:`RestartReason`, read from a mapping by
:func:`read_elastic_state` (pure; no torch).

``unirank run`` knows why it restarted its workers (a node lost or joined, a worker failed,
the hang timeout...) and tells the next attempt's workers in one variable,
UNIRANK_RESTART_REASON: a JSON object written by :meth:`RestartReason.to_value` (its
``attempt`` is the restart count of the attempt it is for, so that a value left over from an
outer run is not taken for this one's). The restart count is torchrun's: the restarts spent,
after failures only (nodes joining restart the workers without spending one), so an attempt
restarted for nodes joining is a restarted one with the count of the one before. Under
torchrun (no unirank parent) the restart count and the maximum
are still known, the reason and the previous world size are not.

Reads (from the mapping it is given): TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS,
WORLD_SIZE, UNIRANK_RESTART_REASON.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from unirank.contract import MAX_RESTARTS_VAR, RESTART_COUNT_VAR, RESTART_REASON_VAR
from unirank.envvars import read_int
from unirank.errors import ConfigError
from unirank.hang.straggle import Straggler

__all__ = ["KINDS", "UNKNOWN", "ElasticState", "RestartReason", "nodes_changed", "parse_reason",
           "read_elastic_state"]

#: the kinds of restart reason, as :attr:`RestartReason.kind` spells them
KINDS = ("node lost", "node evicted", "store moved", "node joined", "world changed",
         "worker failed", "hang timeout",
         "requeued", "unknown")
_HINT = "it is unirank run's; unset it (unirank run sets it for a restarted attempt)"


def nodes_changed(before: Sequence[str], after: Sequence[str],
                  ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The nodes that left and those that joined between two rendezvous rounds, by name, sorted
    (a name twice counts twice)."""
    left = Counter(before) - Counter(after)
    joined = Counter(after) - Counter(before)
    return tuple(sorted(left.elements())), tuple(sorted(joined.elements()))


@dataclass(frozen=True)
class RestartReason:
    """Why the attempt before this one ended, as its supervisor saw it."""

    #: one of :data:`KINDS`
    kind: str
    #: the supervisor's own line on it (``node node2 (10.0.0.2) is lost: no beat for 3 s``)
    message: str = ""
    #: the nodes that left (``node lost``) and joined since the attempt before, by name
    lost_nodes: tuple[str, ...] = ()
    joined_nodes: tuple[str, ...] = ()
    #: the worker at the root of a failure (``worker failed``, ``hang timeout``)
    rank: int | None = None
    exit_code: int | None = None
    node: str | None = None

    def headline(self) -> str | None:
        """The words of a change of the job's nodes, as the failure summary and the restart's
        timeline say them: ``node lost: node2``, ``node evicted: rank 1 never entered
        all_reduce #12``, ``store moved to node node1 (10.0.0.1)``; None for other kinds."""
        if self.kind in ("node evicted", "store moved") and self.message.startswith(self.kind):
            return self.message
        if self.kind in ("node lost", "node evicted", "store moved") and self.lost_nodes:
            return f"{self.kind}: {', '.join(self.lost_nodes)}"
        return None

    def describe(self) -> str:
        """A few words: ``node lost: node2``, ``worker failed: rank 1 (exit code 3)``, and the
        :meth:`headline` of a change of nodes (``node evicted: rank 1 never entered
        all_reduce #12``, ``store moved to node node1 (10.0.0.1)``)."""
        head = self.headline()
        if head is not None:
            return head
        if self.rank is not None:
            code = f" (exit code {self.exit_code})" if self.exit_code is not None else ""
            where = f" on {self.node}" if self.node else ""
            return f"{self.kind}: rank {self.rank}{where}{code}"
        if self.lost_nodes or self.joined_nodes:
            return f"{self.kind}: {', '.join([*self.lost_nodes, *self.joined_nodes])}"
        return self.kind

    def to_value(self, attempt: int, previous_world_size: int) -> str:
        """This reason as UNIRANK_RESTART_REASON for attempt ``attempt``'s workers."""
        return json.dumps({
            "attempt": attempt, "previous_world_size": previous_world_size,
            "kind": self.kind, "message": self.message, "lost_nodes": list(self.lost_nodes),
            "joined_nodes": list(self.joined_nodes), "rank": self.rank,
            "exit_code": self.exit_code, "node": self.node}, sort_keys=True)


#: the reason where no unirank parent said one (torchrun, or a value from another run)
UNKNOWN = RestartReason("unknown", "not known: no unirank run started this attempt")


@dataclass(frozen=True)
class ElasticState:
    """Where this run stands among its attempts (``--max-restarts``)."""

    #: how many restarts were spent, failed attempts only (TORCHELASTIC_RESTART_COUNT)
    restart_count: int
    #: how many restarts the run allows in all (TORCHELASTIC_MAX_RESTARTS)
    max_restarts: int
    #: the world size now
    world_size: int
    #: the world size of the attempt before (None: the first attempt, or not known)
    previous_world_size: int | None = None
    #: why the attempt before ended (None: this is the first attempt)
    reason: RestartReason | None = None
    #: where the job's state came from at ``ur.load_state`` (its one line; None: not asked)
    state_restored: str | None = None
    #: the ranks that keep the others waiting now, as the hang detector names them while the
    #: job runs (:mod:`unirank.hang.slowrank`; ``()``: none, or no detector)
    stragglers: tuple[Straggler, ...] = ()
    #: the node whose link the rendezvous names slow now (its name and address: ``vm
    #: (10.0.0.3)``; "": none, or no such rendezvous: ``unirank run --rdzv-backend c10d`` only)
    slow_link: str = ""

    @property
    def restarted(self) -> bool:
        """Whether this is a restarted attempt (also one restarted for nodes joining, which
        spent no restart: its count may be 0)."""
        return self.restart_count > 0 or self.reason is not None

    @property
    def resized(self) -> bool:
        """Whether the world size changed since the attempt before (False where not known)."""
        return self.previous_world_size not in (None, self.world_size)

    @property
    def restarts_left(self) -> int:
        """How many more restarts the run allows."""
        return max(0, self.max_restarts - self.restart_count)

    def describe(self) -> str:
        """One line: ``restart 1 of 3 (node lost: node2), world size 4 -> 2``; for nodes
        joining ``node joined: node2, no restart spent (1 of 3 spent), world size 2 -> 4``."""
        if not self.restarted:
            return f"first attempt, world size {self.world_size}"
        why = self.reason.describe() if self.reason else "unknown"
        size = (f"world size {self.previous_world_size} -> {self.world_size}"
                if self.resized else f"world size {self.world_size}")
        if self.reason is not None and self.reason.kind == "node joined":  # spent none
            return (f"{why}, no restart spent ({self.restart_count} of {self.max_restarts} "
                    f"spent), {size}")
        return f"restart {self.restart_count} of {self.max_restarts} ({why}), {size}"


def _field(data: dict[str, object], key: str, kind: type | tuple[type, ...],
           value: str) -> object:
    """``data[key]``, which must be of ``kind`` (None allowed where ``kind`` has it)."""
    item = data.get(key)
    if not isinstance(item, kind) or isinstance(item, bool):
        raise ConfigError(f"has no valid {key!r}", variable=RESTART_REASON_VAR, value=value,
                          hint=_HINT)
    return item


def _names(data: dict[str, object], key: str, value: str) -> tuple[str, ...]:
    items = _field(data, key, list, value)
    assert isinstance(items, list)
    if not all(isinstance(name, str) for name in items):
        raise ConfigError(f"has no valid {key!r}", variable=RESTART_REASON_VAR, value=value,
                          hint=_HINT)
    return tuple(items)


def parse_reason(value: str) -> tuple[int, int, RestartReason]:
    """The value of UNIRANK_RESTART_REASON: the attempt it is for, the world size before, and the
    reason; a malformed value is a :class:`ConfigError` naming the variable."""
    try:
        data = json.loads(value)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ConfigError("is not a JSON object", variable=RESTART_REASON_VAR, value=value,
                          hint=_HINT)
    attempt = _field(data, "attempt", int, value)
    previous = _field(data, "previous_world_size", int, value)
    kind = _field(data, "kind", str, value)
    if kind not in KINDS:
        raise ConfigError(f"has an unknown kind {kind!r}", variable=RESTART_REASON_VAR,
                          value=value, hint=f"{_HINT}; kinds: {', '.join(KINDS)}")
    reason = RestartReason(
        kind=str(kind), message=str(_field(data, "message", str, value)),
        lost_nodes=_names(data, "lost_nodes", value),
        joined_nodes=_names(data, "joined_nodes", value),
        rank=_field(data, "rank", (int, type(None)), value),  # type: ignore[arg-type]
        exit_code=_field(data, "exit_code", (int, type(None)), value),  # type: ignore[arg-type]
        node=_field(data, "node", (str, type(None)), value))  # type: ignore[arg-type]
    assert isinstance(attempt, int) and isinstance(previous, int)
    return attempt, previous, reason


def read_elastic_state(environ: Mapping[str, str], world_size: int | None = None,
                       ) -> ElasticState:
    """This process's :class:`ElasticState` from ``environ`` (``world_size``: the world now,
    else WORLD_SIZE, else 1). A bad value is a :class:`ConfigError` naming its variable."""
    count = (read_int(environ, RESTART_COUNT_VAR) if RESTART_COUNT_VAR in environ else 0)
    most = (read_int(environ, MAX_RESTARTS_VAR) if MAX_RESTARTS_VAR in environ else 0)
    if world_size is None:
        world_size = read_int(environ, "WORLD_SIZE", minimum=1) if "WORLD_SIZE" in environ \
            else 1
    value = environ.get(RESTART_REASON_VAR, "")
    if not value.strip():
        return ElasticState(count, most, world_size, None, UNKNOWN if count else None)
    attempt, previous, reason = parse_reason(value)
    if attempt != count:  # left over from another run: not this attempt's reason
        return ElasticState(count, most, world_size, None, UNKNOWN if count else None)
    return ElasticState(count, most, world_size, previous, reason)
