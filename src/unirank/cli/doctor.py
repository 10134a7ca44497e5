"""``unirank doctor``: pre-flight checks of the launcher, GPUs, master address and port, network
interfaces, name look-ups, versions, and a real gloo group joined within a short timeout.

Runs anywhere: a login node, an allocation, every rank (``srun unirank doctor``, ``mpirun unirank
doctor``), or spawning ``-n N`` local ranks through the same engine as ``unirank hello -n``.
With ``--hosts``/``--hostfile`` it checks the hosts over ssh, then one rank on each
(:mod:`unirank.cli.doctorhosts`). Rank 0 prints one table (every rank's failures named by
rank and node), or ``--json``. Exit code 0 when nothing failed, 1 otherwise. No torch at
import; the local checks never import it.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from unirank.doctor.checks import local_checks
from unirank.doctor.facts import Facts, gather
from unirank.doctor.quiet import without_cpp_frames
from unirank.doctor.result import FAIL, SKIP, Check, emit, failed
from unirank.errors import ConfigError
from unirank.gpus import COMMAND_BACKENDS
from unirank.supervisor.plan import IN_PLACE
from unirank.words import counted

if TYPE_CHECKING:
    from unirank.supervisor.plan import Plan

#: a failure of one of these checks makes joining a gloo group pointless (the ranks that do
#: try then name this one as missing, within the timeout)
_BLOCKING = ("launcher", "world size", "master address", "master reachable", "route to master",
             "master port", "GLOO_SOCKET_IFNAME")
DEFAULT_TIMEOUT = 15.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``-n``, ``--backend``, ``--json``, ``--timeout``."""
    parser.add_argument("-n", "--nproc-per-node", dest="nproc_per_node", type=int, default=None,
                        metavar="N", help="spawn N local ranks and check them as a group")
    parser.add_argument("--backend", default="auto", choices=COMMAND_BACKENDS,
                        help="the backend the job will use (nccl needs a GPU per rank)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                        help=f"seconds the group check waits for every rank (default: "
                        f"{DEFAULT_TIMEOUT:g})")
    from unirank.cli.doctorhosts import add_host_arguments

    add_host_arguments(parser)


def _header(facts: Facts, timeout: float, ranks: int) -> list[str]:
    """The line above the table where the launcher placed this rank."""
    env = facts.env
    where = f"rank {env.rank} of {env.world_size}" if env else "launcher unknown"
    return [f"unirank doctor: {where} on {facts.node}; group check: {_group(timeout, ranks)}"]


def _group(timeout: float, ranks: int) -> str:
    return f"gloo group of {ranks}, timeout {timeout:g} s" if ranks > 1 else \
        "no group (a world of 1)"


def _spawn_header(plan: Plan, node: str, timeout: float) -> list[str]:
    """The line above the table for ``-n``: the ranks the doctor starts, in its plan's world."""
    ranks = [w.rank for w in plan.workers]
    if plan.mode == IN_PLACE:
        where = f"rank {ranks[0]} of {plan.world_size} (in place)"
    else:
        span = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"
        where = f"{counted(len(ranks), 'spawned rank')}, {span} of {plan.world_size},"
    return [f"unirank doctor: {where} on {node}; group check: "
            f"{_group(timeout, plan.world_size)}"]


def group_blocker(rows: Sequence[Check]) -> Check | None:
    """The first failed row that makes a group check pointless, if any."""
    return next((r for r in rows if r.status == FAIL and r.name in _BLOCKING), None)


def _skipped(blocker: Check) -> Check:
    return Check("group", SKIP, f"skipped: the '{blocker.name}' row failed, and no group "
                 "can form until it is fixed")


def run_here(facts: Facts, rows: list[Check], args: argparse.Namespace) -> int:
    """In the launcher's context: alone, or one of the world's ranks (group check)."""
    env = facts.env
    world = env.world_size if env else 1
    header = _header(facts, args.timeout, world)
    if world <= 1:
        return emit(rows, header, args.json)
    blocker = group_blocker(rows)
    if blocker is not None:
        return emit([*rows, _skipped(blocker)], header, args.json)
    from unirank.doctor.group import join_and_gather

    with without_cpp_frames():
        merged, speaks = join_and_gather(facts, rows, os.environ, args.timeout)
    if speaks:
        return emit(merged, header, args.json)
    return 1 if failed(merged) else 0


def spawned_rank(local_rank: int, parent: Facts, rows: list[Check], header: list[str],
                 as_json: bool, verdict: str, started: float) -> None:
    """A spawned rank (``-n``): gather every rank's report; rank 0 prints the table with the
    parent's local rows under ``header`` and writes the exit code to ``verdict``. ``started``:
    the parent's wall clock when it spawned (same host), for the join's duration."""
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
    code = emit(merged, header, as_json)
    with open(verdict, "w", encoding="ascii") as handle:
        handle.write(str(code))


def spawn_plan(nproc: int, timeout: float, environ: Mapping[str, str]) -> tuple[Plan, bool]:
    """The layout ``-n`` runs, as :class:`~unirank.runtime.parallel.Parallel` plans it, with
    its master port fixed now, so that the rows check the port the group uses; and whether
    that port was picked here (free), where the plan leaves it to the engine.
    Reads: see :func:`unirank.launchers.detect`."""
    from unirank.launchers import detect
    from unirank.supervisor.listen import open_store_socket
    from unirank.supervisor.plan import LaunchRequest, make_plan

    request = LaunchRequest(nproc_per_node=nproc, spawn_default=None, init_timeout=timeout)
    plan = make_plan(request, detect(environ, sys.argv[1:]), environ, run_id_fallback="doctor")
    if plan.master_port != 0:
        return plan, False
    with open_store_socket(0, host=plan.master_addr) as sock:
        return plan.with_port(int(sock.getsockname()[1])), True


def _spawn(plan: Plan, facts: Facts, rows: list[Check], header: list[str],
           args: argparse.Namespace) -> int:
    """Start the plan's ranks (through ``Parallel``, on its master port); rank 0 prints."""
    import unirank as ur
    from unirank.doctor.facts import now
    from unirank.doctor.groupchecks import join_failed

    with tempfile.TemporaryDirectory(prefix="unirank-doctor-") as folder:
        verdict = os.path.join(folder, "verdict")
        fn = functools.partial(spawned_rank, parent=facts, rows=rows, header=header,
                               as_json=args.json, verdict=verdict, started=now())
        from unirank.runtime.parallel import quiet_launcher_log

        quiet_launcher_log()
        try:
            with without_cpp_frames(), ur.Parallel(
                    backend="gloo", nproc_per_node=args.nproc_per_node,
                    master_port=plan.master_port, init_timeout=args.timeout) as parallel:
                parallel.run(fn)
        except (ConfigError, RuntimeError) as exc:
            return emit([*rows, join_failed(exc, args.timeout)], header, args.json)
        try:
            with open(verdict, encoding="ascii") as handle:
                return int(handle.read().strip() or 1)
        except (OSError, ValueError):
            return 1


def run_spawned(args: argparse.Namespace) -> int:
    """``-n N``: check the master and port the spawned ranks will use, then spawn N local
    ranks (as ``unirank hello -n``); rank 0 prints."""
    from unirank.doctor.groupchecks import join_failed

    try:
        plan, picked = spawn_plan(args.nproc_per_node, args.timeout, os.environ)
    except ConfigError as exc:  # the launcher's or the layout's mistake: the rows say which
        facts = gather(os.environ, backend=args.backend, spawn=args.nproc_per_node)
        rows = local_checks(facts)
        return emit([*rows, join_failed(exc, args.timeout)],
                    _header(facts, args.timeout, args.nproc_per_node), args.json)
    master = (plan.master_addr, plan.master_port,
              plan.master_source or "default: one node, 127.0.0.1")
    facts = gather(os.environ, backend=args.backend, spawn=args.nproc_per_node,
                   serves=plan.hosts_store, master=master, port_picked=picked)
    rows = local_checks(facts)
    header = _spawn_header(plan, facts.node, args.timeout)
    blocker = group_blocker(rows)
    if blocker is not None:
        return emit([*rows, _skipped(blocker)], header, args.json)
    return _spawn(plan, facts, rows, header, args)


def main(args: argparse.Namespace) -> int:
    """Run the checks. Reads: see :func:`unirank.doctor.facts.gather` and, for the group check,
    :func:`unirank.init`."""
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        raise ConfigError("must be at least 1", variable="-n", value=str(args.nproc_per_node))
    if args.hosts or args.hostfile:
        from unirank.cli.doctorhosts import main_hosts

        return main_hosts(args, os.environ)
    if args.nproc_per_node:
        return run_spawned(args)
    facts = gather(os.environ, backend=args.backend, spawn=None)
    rows = local_checks(facts)
    code = run_here(facts, rows, args)
    sys.stdout.flush()
    return code
