"""``unirank run``: start this node's workers with torchrun's environment, and supervise them.

``unirank run [options] SCRIPT [ARGS...]`` or ``unirank run [options] -m MODULE [ARGS...]``:
everything after SCRIPT (or MODULE) goes to the script. Inside srun or mpirun with one task per
node it is the per-node launcher; in a Slurm allocation shell with no step it starts itself
through srun. The parent process never imports torch.

Every option of torchrun 2.13 is accepted (see docs/run.md's torchrun compatibility table),
and one not on the command line takes its default from ``PET_<OPTION>`` as under torchrun: the
table of options is :mod:`unirank.cli.runoptions`, what they turn into :mod:`unirank.cli.runconfig`;
this module is the orchestration.

With ``--hosts``/``--hostfile`` it starts one ``unirank run`` per host over ssh instead
(:mod:`unirank.cli.sshrun`); ``--from-ssh`` is that remote side.

Reads: PET_* (every torchrun option's), UNIRANK_INIT_TIMEOUT, UNIRANK_NO_SRUN, MASTER_ADDR,
MASTER_PORT, CUDA_VISIBLE_DEVICES and whatever the outer launcher's detection reads (see
:mod:`unirank.launchers`); with --hosts, the variables it carries (:mod:`unirank.cli.sshrun`).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from unirank.cli.runconfig import (
    build_request,
    endpoint,
    engine_options,
    noted_lines,
    outer_launcher,
    preload,
    target_of,
)
from unirank.cli.runoptions import describe_sources, settle
from unirank.errors import ConfigError
from unirank.exitcodes import USAGE, killed_by
from unirank.supervisor.rdzv.client import StoppedWaiting
from unirank.supervisor.recovery import NextRound

if TYPE_CHECKING:
    import socket

    from unirank.distenv import DistEnv
    from unirank.supervisor.attempts import EngineOptions
    from unirank.supervisor.filetimer import TimerServer
    from unirank.supervisor.fork.client import ForkServer
    from unirank.supervisor.plan import LaunchRequest, Plan
    from unirank.supervisor.rdzv.client import RendezvousHelper
    from unirank.supervisor.rdzv.spec import Assignment
    from unirank.supervisor.summary import RunResult

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``unirank run``: every option of torchrun 2.13, and unirank's own
    (:data:`unirank.cli.runoptions.OPTIONS`), the program, and the ssh launcher's."""
    from unirank.cli.runoptions import add_run_options
    from unirank.cli.sshrun import add_ssh_arguments

    add_run_options(parser)
    parser.add_argument("program", metavar="SCRIPT|MODULE", nargs="?",
                        help="the script (or module, or program) to run")
    parser.add_argument("program_args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="arguments for the script")
    add_ssh_arguments(parser)
    # the option strings that take a value: what unirank run --hosts strips from its own line
    parser.set_defaults(value_options=tuple(
        name for action in parser._actions if action.option_strings and action.nargs != 0
        for name in action.option_strings))


#: the planner's argument names as unirank run's options
_OPTION_NAMES = {"nproc_per_node": "--nproc-per-node", "nnodes": "--nnodes",
                 "node_rank": "--node-rank", "master_addr": "--master-addr",
                 "master_port": "--master-port", "max_restarts": "--max-restarts"}


def inner_command(args: argparse.Namespace, nproc: int, nnodes: int) -> list[str]:
    """This ``unirank run`` as a command line for each node of an srun step: the node count and
    the number of workers where the user gave none, then the user's own options, each once."""
    from unirank.cli.sshrun import relaunch_argv

    raw = list(getattr(args, "raw_argv", None) or [])
    added = [] if args.nnodes is not None else ["--nnodes", str(nnodes)]
    if args.nproc_per_node is None:
        added += ["--nproc-per-node", str(nproc)]
    return relaunch_argv(added, raw)


def _nproc_in_allocation(args: argparse.Namespace, request: LaunchRequest,
                         outer: DistEnv) -> int:
    """``-n`` for the nodes of an allocation: as given, else the allocation's tasks per node
    when it planned several (``sbatch --ntasks-per-node=4``), else ``auto``'s answer."""
    default = request.spawn_default or 1
    if request.nproc_per_node is not None:
        return request.nproc_per_node
    if not outer.planned_tasks:
        return default
    nodes = max(1, outer.num_nodes)
    per_node, rest = divmod(outer.planned_tasks, nodes)
    if rest == 0 and per_node > 1:
        return per_node
    return default


def _master_source(args: argparse.Namespace, planned: str) -> str:
    """The option or variable the master address came from (``planned``: the plan's
    ``master_source``, with ``master_addr`` for the options)."""
    if planned != "master_addr":
        return planned or "MASTER_ADDR"
    return "--master-addr" if args.master_addr or not args.rdzv_endpoint else "--rdzv-endpoint"


def _refuse(error: ConfigError, request: LaunchRequest, outer: DistEnv,
            environ: Mapping[str, str]) -> NoReturn:
    """This node will not start its workers: say why, and where the plan names others to tell
    (:func:`unirank.supervisor.plan.giveup_address`) tell them through node 0's store
    (:mod:`unirank.supervisor.giveup`), so that their workers end at once naming this node
    instead of waiting for the init timeout."""
    from unirank.supervisor.plan import giveup_address

    print(f"unirank run: error: {error}", file=sys.stderr, flush=True)
    address = giveup_address(request, outer)
    if address is not None:
        from unirank.resolve import require_resolvable
        from unirank.supervisor.giveup import tell_others

        try:
            require_resolvable(address[0], source="MASTER_ADDR")
        except ConfigError:
            raise SystemExit(USAGE) from None
        tell_others(*address, f"node {outer.node_name} refused to start its workers: {error}",
                    environ)
    raise SystemExit(USAGE)


def _plan_and_run(args: argparse.Namespace, request: LaunchRequest, outer: DistEnv,
                  environ: Mapping[str, str], options: EngineOptions, target: list[str],
                  server: ForkServer | None) -> RunResult:
    """Plan this node's workers, then start and supervise them."""
    from dataclasses import replace

    from unirank.cli import elastic
    from unirank.cli.elastic import DEFAULT_RUN_ID
    from unirank.supervisor.attempts import run_plan
    from unirank.supervisor.plan import make_plan

    if elastic.wanted(args, outer):
        return _rendezvous_and_run(args, request, outer, environ, options, target, server)
    # torchrun's TORCHELASTIC_RUN_ID without --rdzv-id: its default, none, for the static
    # rendezvous (several nodes, or a port given); else a fresh uuid4 for the c10d rendezvous
    # at localhost:0 it starts on one node (which the plan's master, localhost, follows too)
    try:
        plan = make_plan(request, outer, environ,
                         run_id_fallback=None if request.stacked else DEFAULT_RUN_ID)
    except ConfigError as exc:
        _refuse(exc.renamed(_OPTION_NAMES), request, outer, environ)
    plan = replace(plan, master_source=_master_source(args, plan.master_source))
    if plan.world_size > 1:  # at once, not after the workers' init timeout
        from unirank.resolve import require_resolvable

        require_resolvable(plan.master_addr, source=plan.master_source)
    return run_plan(plan, target, environ=environ, options=options, server=server)


def _rendezvous_and_run(args: argparse.Namespace, request: LaunchRequest, outer: DistEnv,
                        environ: Mapping[str, str], options: EngineOptions,
                        target: list[str], server: ForkServer | None) -> RunResult:
    """Join the dynamic rendezvous (:mod:`unirank.cli.elastic`), plan this node's workers at
    the node rank it assigned, then start and supervise them."""
    from unirank.cli import elastic
    from unirank.signals import STOP_SIGNALS
    from unirank.supervisor.wakeup import signals_on_a_pipe

    nproc = request.nproc_per_node or request.spawn_default or 1
    if server is not None:
        _warm_while_waiting(server, request, outer, environ, options, nproc)
    # a stop signal while no worker runs (a round awaited) ends the wait: StoppedWaiting
    with signals_on_a_pipe({*options.signals, *STOP_SIGNALS}) as stop_fd:
        return _join_and_run(args, request, outer, environ, options, target, server,
                             elastic.join(args, endpoint(args), nproc, outer, environ, stop_fd))


def _warm_while_waiting(server: ForkServer, request: LaunchRequest, outer: DistEnv,
                        environ: Mapping[str, str], options: EngineOptions, nproc: int) -> None:
    """An elastic node's fork server imports while the node waits for its round, not after:
    a spare (a node beyond MAX, waiting to join) is warm when a lost node's place comes, and
    a first round overlaps the import. Configured with the plan of a world of this node
    alone; a round's plan differs in what each forked worker sets itself (its ranks, world
    and master: :meth:`~unirank.supervisor.fork.client.ForkServer.why_not`)."""
    from unirank.cli import elastic
    from unirank.supervisor.launching import configure_server
    from unirank.supervisor.plan import make_plan
    from unirank.supervisor.rdzv.spec import Assignment

    alone = Assignment(node_rank=0, nnodes=1, ranks_per_node=(nproc,),
                       hosts=(outer.node_name or "localhost",), master_addr="127.0.0.1",
                       master_port=1)
    try:
        plan = make_plan(request, outer, environ, run_id_fallback=elastic.DEFAULT_RUN_ID,
                         assignment=alone)
    except ConfigError:
        return  # the round's own plan says what is wrong
    configure_server(server, plan, environ, options)


def _join_and_run(args: argparse.Namespace, request: LaunchRequest, outer: DistEnv,
                  environ: Mapping[str, str], options: EngineOptions, target: list[str],
                  server: ForkServer | None,
                  joined: tuple[RendezvousHelper, socket.socket, Assignment]) -> RunResult:
    """Plan and run at each round's place (:func:`_rendezvous_and_run`)."""
    from dataclasses import replace

    from unirank.cli import elastic
    from unirank.supervisor.attempts import run_plan
    from unirank.supervisor.plan import make_plan

    helper, sock, assignment = joined

    def plan_at(place: Assignment) -> Plan:
        plan = make_plan(request, outer, environ, run_id_fallback=elastic.DEFAULT_RUN_ID,
                         assignment=place)
        return replace(plan, master_source="--rdzv-endpoint")

    places = [assignment]

    def replan(attempt: int, verdict: Mapping[str, Any] | None) -> NextRound:
        """A restart: the next round (the world may change), the nodes of the ranks a hang
        verdict names evicted first (``--on-hang evict``); its line is said by the engine,
        after the restart's."""
        began = time.monotonic()
        places.append(helper.next(first=False, **elastic.eviction(places[-1], verdict)))
        noticed = helper.noticed_before(began)
        line = elastic.describe_round(places[-2], places[-1], time.monotonic() - began,
                                      noticed)
        return NextRound(plan_at(places[-1]), f"unirank run: {line}", noticed,
                         helper.moved())

    result: RunResult | None = None
    try:
        plan = plan_at(assignment)
        # kept on every node: node rank 0 may move here (its node lost, the store moved)
        result = run_plan(plan, target, environ=environ, options=options, server=server,
                          listening=sock, replan=replan, watch=helper)
        return result
    finally:
        helper.close(succeeded=result is not None and result.exit_code == 0)


def main(args: argparse.Namespace) -> int:
    """Plan, start and supervise this node's workers; returns the exit code."""
    if args.program is None:
        raise ConfigError(
            "no script or module to run",
            hint="unirank run [options] script.py [args...]  or  unirank run [options] -m module",
        )
    from unirank.cli.sshrun import check_ssh_only
    from unirank.cli.target import check_target
    from unirank.supervisor.pidone import stand_in_for_init

    stand_in_for_init()  # PID 1 of a container: an init forwards signals and reaps orphans
    check_ssh_only(args)
    environ = dict(os.environ)
    if args.from_ssh:  # a host of unirank run --hosts: its environment, then the watch
        from unirank.supervisor.ssh.stdinwatch import take_environ, watch_stdin

        received, stream = take_environ()
        environ.update(received)
        watch_stdin(stream)
    # torchrun's PET_* defaults are this node's; hosts over ssh get them only with -x
    settle(args, {} if args.hosts or args.hostfile else environ)
    target = target_of(args)  # refuses --no-python with -m before the program is looked at
    problem = check_target(args.program, module=args.module, no_python=args.no_python,
                           cwd=os.getcwd(), environ=environ)
    if problem is not None:  # as python says it, before any worker starts
        print(f"unirank run: {problem.message}", file=sys.stderr, flush=True)
        return problem.exit_code
    if args.hosts or args.hostfile:
        from unirank.cli.sshrun import main_hosts

        return main_hosts(args, environ)
    from unirank.supervisor.fork.client import start_server

    timer = _file_timer(environ)  # first: the workers' environment names its pipe
    try:
        # first: it imports torch while this process plans
        server = start_server(target, environ,
                              preload(args.preload, no_preload=args.no_preload),
                              prog="unirank run")
        try:
            return _run(args, environ, target, server)
        except StoppedWaiting as stop:  # no worker ran since: the stop is said here
            name = signal.Signals(stop.signum).name
            print(f"unirank run: got {name} while waiting for a rendezvous round: stopped "
                  "(no worker was running)", file=sys.stderr, flush=True)
            return killed_by(stop.signum)
        finally:
            if server is not None:
                server.close()
    finally:
        if timer is not None:
            timer.close()


def _file_timer(environ: dict[str, str]) -> TimerServer | None:
    """torchelastic's file-based watchdog where TORCHELASTIC_ENABLE_FILE_TIMER=1 asks for it
    (:mod:`unirank.supervisor.filetimer`); its pipe goes to the workers in
    TORCHELASTIC_TIMER_FILE."""
    from unirank.contract import TIMER_FILE_VAR
    from unirank.supervisor.filetimer import TimerServer, timer_file

    path = timer_file(environ)
    if path is None:
        return None
    environ[TIMER_FILE_VAR] = path
    return TimerServer(path)


def _run(args: argparse.Namespace, environ: dict[str, str], target: list[str],
         server: ForkServer | None) -> int:
    """Plan, start and supervise this node's workers (``server``: the node's fork server, if
    any); returns the exit code."""
    notes: list[str] = []
    sources = describe_sources(args)
    if sources:
        print(f"unirank run: {sources}", file=sys.stderr, flush=True)
    outer = outer_launcher(environ)  # once: the request, the options and the plan share it
    request = build_request(args, environ, notes, outer)
    options = engine_options(args, environ, outer)
    notes += noted_lines(args, outer)
    for note in notes:
        print(f"unirank run: note: {note}", file=sys.stderr, flush=True)
    if outer.launch_required and not request.standalone:
        from unirank.supervisor.reexec import reexec_through_srun

        if server is not None:
            server.close()  # this process becomes srun: the step's unirank run starts its own
        nnodes = request.nnodes if request.nnodes is not None else max(1, outer.num_nodes)
        nproc = _nproc_in_allocation(args, request, outer)
        reexec_through_srun(nnodes, inner_command(args, nproc, nnodes), environ)
    result = _plan_and_run(args, request, outer, environ, options, target, server)
    from unirank.supervisor.summary import format_summary

    summary = format_summary(result)
    if summary:
        sys.stderr.write(summary)
        sys.stderr.flush()
    if args.from_ssh:  # for the launcher's choice of the root cause across hosts
        from unirank.supervisor.ssh.remote import verdict_line

        failure = result.first_failure
        sys.stderr.write(verdict_line(failure is not None,
                                      failure is not None and failure.lost_peer))
        sys.stderr.flush()
    return result.exit_code
