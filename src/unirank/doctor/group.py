"""The group check: every rank joins a gloo group (through :func:`unirank.init`, so the join check
of :mod:`unirank.joincheck` names the ranks that never came) within a short timeout, and sends
rank 0 its :class:`~unirank.doctor.groupchecks.RankReport`. Imports torch (when called).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from unirank.doctor.facts import Facts, now
from unirank.doctor.groupchecks import RankReport, group_checks, join_failed
from unirank.doctor.result import Check, merge
from unirank.gpus import physical_gpu

__all__ = ["join_and_gather", "rank_report"]


def rank_report(facts: Facts, checks: Sequence[Check], environ: Mapping[str, str],
                local_rank: int) -> RankReport:
    """This rank's report (without its clock, which :func:`join_and_gather` stamps)."""
    import unirank as ur

    master = facts.master.answer if facts.master else None
    return RankReport(rank=ur.get_rank(), node=facts.node, checks=tuple(checks), master=master,
                      versions=facts.versions, gpu=physical_gpu(environ, local_rank, facts.gpus),
                      clock=0.0, port=facts.env.master_port if facts.env else None)


def gather_reports(report: RankReport) -> list[RankReport]:
    """Every rank's report, in rank order, through the group that is up; each stamped with its
    rank's wall clock just before the gather."""
    import dataclasses

    import unirank as ur

    ur.barrier()
    gathered: list[RankReport] = ur.all_gather(dataclasses.replace(report, clock=now()))
    return gathered


def join_and_gather(facts: Facts, checks: Sequence[Check], environ: Mapping[str, str],
                    timeout: float) -> tuple[list[Check], bool]:
    """Join a gloo group within ``timeout`` seconds and gather every rank's report: (the merged
    rows, whether this rank is rank 0). A join that fails gives this rank's rows and the
    failed ``group`` row.

    Reads: the launcher's variables (through :func:`unirank.init`), CUDA_VISIBLE_DEVICES.
    """
    import unirank as ur

    env = facts.env
    assert env is not None
    start = time.monotonic()
    try:
        ur.init(backend="gloo", init_timeout=timeout)
        try:
            reports = gather_reports(rank_report(facts, checks, environ, env.local_rank))
        finally:
            ur.finalize()
    except Exception as exc:  # any failure to form the group is the finding
        return [*checks, join_failed(exc, timeout)], True
    return merged_rows(reports, facts, time.monotonic() - start), env.rank == 0


def merged_rows(reports: Sequence[RankReport], facts: Facts, seconds: float) -> list[Check]:
    """The local rows of every rank merged, then the group rows."""
    hosts = facts.env.hosts if facts.env else ()
    return [*merge([(r.who, r.checks) for r in reports]),
            *group_checks(reports, expected_nodes=hosts, backend=facts.backend,
                          seconds=seconds)]
