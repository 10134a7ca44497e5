"""``unirank doctor``: pre-flight checks of the launcher, GPUs, master address and port, network
interfaces, name look-ups, versions, and a real gloo group joined within a short timeout.

Runs anywhere: a login node, an allocation, every rank (``srun unirank doctor``, ``mpirun unirank
doctor``), or spawning ``-n N`` local ranks through the same engine as ``unirank hello -n``.
Rank 0 prints one table (every rank's failures named by rank and node), or ``--json``. Exit code
0 when nothing failed, 1 otherwise. No torch at import; the local checks never import it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
from collections.abc import Sequence

from unirank.doctor.checks import local_checks
from unirank.doctor.facts import Facts, gather
from unirank.doctor.result import FAIL, Check, failed, format_table, to_json
from unirank.errors import ConfigError

#: a failure of one of these checks makes joining a gloo group pointless (the ranks that do
#: try then name this one as missing, within the timeout)
_BLOCKING = ("launcher", "world size", "master address", "route to master", "master port",
             "GLOO_SOCKET_IFNAME")
DEFAULT_TIMEOUT = 15.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``-n``, ``--backend``, ``--json``, ``--timeout``."""
    parser.add_argument("-n", "--nproc-per-node", dest="nproc_per_node", type=int, default=None,
                        metavar="N", help="spawn N local ranks and check them as a group")
    parser.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"),
                        help="the backend the job will use (nccl needs a GPU per rank)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                        help=f"seconds the group check waits for every rank (default: "
                        f"{DEFAULT_TIMEOUT:g})")


def _header(facts: Facts, timeout: float, ranks: int) -> list[str]:
    env = facts.env
    where = f"rank {env.rank} of {env.world_size}" if env else "launcher unknown"
    group = f"gloo group of {ranks}, timeout {timeout:g} s" if ranks > 1 else \
        "no group (a world of 1)"
    return [f"unirank doctor: {where} on {facts.node}; group check: {group}"]


def emit(rows: Sequence[Check], header: Sequence[str], as_json: bool) -> int:
    """Print the table (or JSON) on stdout; the exit code."""
    if as_json:
        print(json.dumps(to_json(rows, {"header": list(header)}), indent=2), flush=True)
    else:
        print(format_table(rows, header), flush=True)
    return 1 if failed(rows) else 0


def _blocked(rows: Sequence[Check]) -> bool:
    return any(r.status == FAIL and r.name in _BLOCKING for r in rows)


def run_here(facts: Facts, rows: list[Check], args: argparse.Namespace) -> int:
    """In the launcher's context: alone, or one of the world's ranks (group check)."""
    env = facts.env
    world = env.world_size if env else 1
    header = _header(facts, args.timeout, world)
    if world <= 1:
        return emit(rows, header, args.json)
    if _blocked(rows):
        rows.append(Check("group", FAIL, "not tried: fix the failures above first"))
        return emit(rows, header, args.json)
    from unirank.doctor.group import join_and_gather

    merged, speaks = join_and_gather(facts, rows, os.environ, args.timeout)
    if speaks:
        return emit(merged, header, args.json)
    return 1 if failed(merged) else 0


def spawned_rank(local_rank: int, parent: Facts, rows: list[Check], timeout: float,
                 as_json: bool, verdict: str, started: float) -> None:
    """A spawned rank (``-n``): gather every rank's report; rank 0 prints the table with the
    parent's local rows and writes the exit code to ``verdict``. ``started``: the parent's wall
    clock when it spawned (same host), for the join's duration."""
    import unirank as ur
    from unirank.doctor.facts import now
    from unirank.doctor.group import gather_reports, rank_report
    from unirank.doctor.groupchecks import group_checks

    facts = gather(os.environ, backend=parent.backend, spawn=None, serves=False)
    reports = gather_reports(rank_report(facts, (), os.environ, local_rank))
    if ur.get_rank() != 0:
        return
    merged = [*rows, *group_checks(reports, expected_nodes=(), backend=parent.backend,
                                   seconds=now() - started)]
    code = emit(merged, _header(parent, timeout, len(reports)), as_json)
    with open(verdict, "w", encoding="ascii") as handle:
        handle.write(str(code))


def run_spawned(facts: Facts, rows: list[Check], args: argparse.Namespace) -> int:
    """``-n N``: spawn N local ranks (as ``unirank hello -n``); rank 0 prints."""
    import unirank as ur
    from unirank.doctor.facts import now
    from unirank.doctor.groupchecks import join_failed

    header = _header(facts, args.timeout, args.nproc_per_node)
    if _blocked(rows):
        return emit([*rows, Check("group", FAIL, "not tried: fix the failures above first")],
                    header, args.json)
    with tempfile.TemporaryDirectory(prefix="unirank-doctor-") as folder:
        verdict = os.path.join(folder, "verdict")
        fn = functools.partial(spawned_rank, parent=facts, rows=rows, timeout=args.timeout,
                               as_json=args.json, verdict=verdict, started=now())
        try:
            with ur.Parallel(backend="gloo", nproc_per_node=args.nproc_per_node,
                             init_timeout=args.timeout) as parallel:
                parallel.run(fn)
        except (ConfigError, RuntimeError) as exc:
            return emit([*rows, join_failed(exc, args.timeout)], header, args.json)
        try:
            with open(verdict, encoding="ascii") as handle:
                return int(handle.read().strip() or 1)
        except (OSError, ValueError):
            return 1


def main(args: argparse.Namespace) -> int:
    """Run the checks. Reads: see :func:`unirank.doctor.facts.gather` and, for the group check,
    :func:`unirank.init`."""
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        raise ConfigError("must be at least 1", variable="-n", value=str(args.nproc_per_node))
    facts = gather(os.environ, backend=args.backend, spawn=args.nproc_per_node)
    rows = local_checks(facts)
    if args.nproc_per_node:
        return run_spawned(facts, rows, args)
    code = run_here(facts, rows, args)
    sys.stdout.flush()
    return code
