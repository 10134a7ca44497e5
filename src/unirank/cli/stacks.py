"""``unirank stacks``: every rank's progress and Python stack of a running job, now, grouped,
without stopping anything.

From another shell on any node of the job: the node's job file (:mod:`unirank.hang.jobs`,
written by the hang watcher of the node's first rank) says where the job's store is; the
command asks every rank's watcher for its stacks through the store (the same request as the
hang report's), waits for them a bounded time, and prints them with each rank's collective
progress. ``--job ID`` picks one of several jobs (a run id, or a Slurm job id); in a Slurm
job's shell the job's id is the default. Needs the hang detector on (its default). A job file
written in another PID namespace (a container's, seen from the host) cannot be checked here
(:mod:`unirank.owner`): it never counts as a running job; where only such files are found the
error names them, and ``--job ID`` naming one asks its store.

Reads: SLURM_JOB_ID (through :mod:`unirank.launchers.slurm_vars`), TMPDIR.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from unirank.errors import ConfigError
from unirank.hang.timings import ANSWER

__all__ = ["add_arguments", "find_job", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``unirank stacks``."""
    parser.add_argument("--job", default=None, metavar="ID",
                        help="the job's run id (--rdzv-id, TORCHELASTIC_RUN_ID) or Slurm job "
                        "id (default: the one job running on this node; in a Slurm job's shell, "
                        "that job)")
    parser.add_argument("--timeout", default=None, metavar="S",
                        help="seconds to wait for the ranks' answers (default: "
                        f"{ANSWER.words()}, the job's watcher intervals)")


def _pick(job: str | None, named: bool = False) -> dict[str, object]:
    """The job to ask: the one running job (of ``job``, where given); else, where the user
    ``named`` the job, the one job file of it that cannot be checked (written in another PID
    namespace: its store answers, or the job is gone). Never counts an unchecked file as a
    running job."""
    from unirank.hang.jobs import jobs_dir, scan_jobs

    found, unchecked = scan_jobs(job)
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        ids = ", ".join(str(j["run_id"]) for j in found)
        raise ConfigError(f"several unirank jobs run on this node: {ids}", variable="--job",
                          value=job, hint="name one with --job ID")
    if named and len(unchecked) == 1:
        return unchecked[0]
    label = "" if job is None else " " + repr(job)
    if unchecked:
        ids = ", ".join(str(j["run_id"]) for j in unchecked)
        raise ConfigError(
            f"no running unirank job{label} that this shell can check on this node; job "
            f"files written in another PID namespace (a container) name: {ids}",
            hint="run unirank stacks inside the job's container, or name one with --job ID")
    raise ConfigError(f"no running unirank job{label} on this node (no live job file in "
                      f"{jobs_dir()})", hint="run this on a node of the job, whose hang "
                      "detector is on (not --hang-report-after off)")


def find_job(named: str | None) -> dict[str, object]:
    """The job file of the job ``--job`` names (None: in a Slurm job's shell that job, else
    the one job running on this node); a :class:`ConfigError` where there is none or several
    (also ``unirank top``'s)."""
    from unirank.launchers import slurm_vars

    job_id = named or slurm_vars.job_id(os.environ)[0]
    return (_pick(job_id, named=bool(named)) if named or _has(job_id) else _pick(None))


def main(args: argparse.Namespace) -> int:
    """Print every rank's progress and stacks (see the module docstring)."""
    from unirank.contract import HangSettings, parse_seconds

    job = find_job(args.job)
    interval = float(str(job.get("interval", HangSettings.interval)))
    timeout = (parse_seconds(str(args.timeout), "--timeout") if args.timeout is not None
               else ANSWER.of(interval))
    from unirank.hang.exchange import read_records, request_stacks
    from unirank.hang.render import render_snapshot
    from unirank.store import StoreError, open_store

    addr, port = str(job["master_addr"]), int(str(job["master_port"]))
    try:
        store = open_store(addr, port, rank=-1, timeout=timeout, served_by="rank 0",
                           hint="the job may have just ended")
    except StoreError as exc:
        print(f"unirank stacks: error: {exc.what}", file=sys.stderr)
        return 1
    world = int(str(job["world_size"]))
    stacks, missing, nodes = request_stacks(store, world, timeout)
    records = read_records(store, world)
    nodes.update({r: str(rec.get("node", "")) for r, rec in records.items() if rec})
    print(render_snapshot(records, stacks, job=str(job["run_id"]), unanswered=missing,
                          nodes=nodes, now=time.time(), answer_timeout=timeout), end="")
    return 0


def _has(job_id: str | None) -> bool:
    from unirank.hang.jobs import find_jobs

    return job_id is not None and bool(find_jobs(job_id))
