"""The group checks: pure functions over every rank's :class:`RankReport`, gathered through the
gloo group (:mod:`~unirank.doctor.group`), and the row for a join that failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from unirank.doctor.facts import Versions
from unirank.doctor.result import FAIL, OK, WARN, Check
from unirank.words import counted

__all__ = ["MAX_SKEW", "RankReport", "group_checks", "join_failed"]

#: clocks further apart than this (seconds) make logs and timeouts across nodes misleading
MAX_SKEW = 1.0


@dataclass(frozen=True)
class RankReport:
    """What one rank sends rank 0: who it is, its local rows, and the facts compared across
    ranks (``gpu``: the physical GPU it would use, None on the CPU; ``clock``: its wall clock
    at the gather; ``port``: the master port its group met on)."""

    rank: int
    node: str
    checks: tuple[Check, ...]
    master: tuple[str, ...] | None
    versions: Versions | None
    gpu: str | None
    clock: float
    port: int | None = None

    @property
    def who(self) -> str:
        """``rank R (node)``."""
        return f"rank {self.rank} ({self.node})"


def _by_value(reports: Sequence[RankReport], key: str) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for report in reports:
        value = getattr(report, key)
        shown = ", ".join(value) if isinstance(value, tuple) else str(value)
        groups.setdefault(shown, []).append(report.who)
    return groups


def check_joined(reports: Sequence[RankReport], expected_nodes: Sequence[str],
                 seconds: float) -> Check:
    """Every rank joined; the nodes that joined are those the launcher named."""
    nodes = sorted({r.node for r in reports})
    port = f" on port {reports[0].port}" if reports and reports[0].port else ""
    detail = f"{counted(len(reports), 'rank')} on {counted(len(nodes), 'node')} " \
        f"({', '.join(nodes)}) joined a " \
        f"gloo group{port} in {seconds:.1f} s"
    missing = sorted(set(expected_nodes) - set(nodes))
    if missing:
        return Check("group", FAIL, f"{detail}, but no rank joined from {', '.join(missing)}",
                     "start one task per node on every node (srun -N<nodes>), or fix launcher "
                     "detection there (unirank info on that node)")
    return Check("group", OK, detail)


def check_same_master(reports: Sequence[RankReport]) -> Check:
    """MASTER_ADDR resolves to the same address on every rank."""
    groups = _by_value(reports, "master")
    if len(groups) <= 1:
        return Check("same master", OK, f"every rank resolves it to {next(iter(groups), '?')}")
    what = "; ".join(f"{', '.join(who)}: {value}" for value, who in groups.items())
    return Check("same master", FAIL, f"the master resolves differently: {what}",
                 "export MASTER_ADDR=<the first node's IP address> (the same on every rank)")


def check_versions(reports: Sequence[RankReport]) -> Check:
    """The same Python, unirank and torch on every rank."""
    groups = _by_value(reports, "versions")
    first = reports[0].versions
    if len(groups) <= 1 and first is not None:
        return Check("same versions", OK, f"python {first.python}, unirank {first.unirank}, "
                     f"torch {first.torch} on every rank")
    what = "; ".join(f"{', '.join(who)}: {value}" for value, who in groups.items())
    return Check("same versions", FAIL, f"ranks differ: {what}",
                 "use one environment on every node (the same venv or module load in the job "
                 "script)")


def check_clock(reports: Sequence[RankReport]) -> Check:
    """Each rank's clock against rank 0's, sampled at the same gather."""
    base = reports[0].clock
    skews = [(abs(r.clock - base), r) for r in reports]
    worst, who = max(skews, key=lambda pair: pair[0])
    detail = f"largest skew to rank 0: {worst:.3f} s ({who.who})"
    if worst > MAX_SKEW:
        return Check("clock skew", WARN, detail,
                     "synchronise the nodes' clocks (chronyd or ntpd on every node)")
    return Check("clock skew", OK, detail)


def check_gpu_sharing(reports: Sequence[RankReport], backend: str) -> Check:
    """No two ranks of one node bound to the same GPU (nccl cannot share one)."""
    users: dict[tuple[str, str], list[str]] = {}
    for report in reports:
        if report.gpu is not None:
            users.setdefault((report.node, report.gpu), []).append(report.who)
    shared = {key: who for key, who in users.items() if len(who) > 1}
    if not shared:
        return Check("gpu binding", OK, f"{counted(len(users), 'rank')} on a GPU of their own"
                     if users else "no rank uses a GPU")
    what = "; ".join(f"GPU {gpu} on {node}: {', '.join(who)}" for (node, gpu), who in
                     shared.items())
    status = FAIL if backend == "nccl" else WARN
    return Check("gpu binding", status, f"ranks share a GPU: {what}",
                 "give each task its own GPU: srun --gpus-per-task=1 (or --ntasks-per-node="
                 "<GPUs per node>), or --backend gloo")


def group_checks(reports: Sequence[RankReport], *, expected_nodes: Sequence[str],
                 backend: str, seconds: float) -> list[Check]:
    """Every group check, in table order (``reports`` in rank order)."""
    return [check_joined(reports, expected_nodes, seconds), check_same_master(reports),
            check_versions(reports), check_clock(reports),
            check_gpu_sharing(reports, backend)]


def join_failed(error: BaseException, timeout: float) -> Check:
    """The row for a group that did not form within ``timeout`` (the join check's message names
    the missing ranks and their nodes)."""
    text = " ".join(str(error).split())
    text = text.split(" Check that those ranks")[0]
    return Check("group", FAIL, f"the gloo group did not form (timeout {timeout:g} s): {text}",
                 "start every rank (srun/mpirun task counts, --nnodes, --node-rank) and let "
                 "each reach MASTER_ADDR:MASTER_PORT; raise --timeout if they are slow to start")
