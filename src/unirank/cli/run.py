"""``unirank run``: start this node's workers with torchrun's environment, and supervise them.

``unirank run [options] SCRIPT [ARGS...]`` or ``unirank run [options] -m MODULE [ARGS...]``:
everything after SCRIPT (or MODULE) goes to the script. Inside srun or mpirun with one task per
node it is the per-node launcher; in a Slurm allocation shell with no step it starts itself
through srun. The parent process never imports torch.

Every option of torchrun 2.13 is accepted (see README's torchrun compatibility table).

With ``--hosts``/``--hostfile`` it starts one ``unirank run`` per host over ssh instead
(:mod:`unirank.cli.sshrun`); ``--from-ssh`` is that remote side.

Reads: UNIRANK_INIT_TIMEOUT, UNIRANK_NO_SRUN, MASTER_ADDR, MASTER_PORT, CUDA_VISIBLE_DEVICES and
whatever the outer launcher's detection reads (see :mod:`unirank.launchers`); with --hosts,
the variables it carries (:mod:`unirank.cli.sshrun`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from unirank.errors import ConfigError

if TYPE_CHECKING:
    from unirank.distenv import DistEnv
    from unirank.supervisor.attempts import EngineOptions
    from unirank.supervisor.fork.client import ForkServer
    from unirank.supervisor.plan import LaunchRequest, Plan
    from unirank.supervisor.rdzv.spec import Assignment
    from unirank.supervisor.summary import RunResult

_EPILOG = (
    "Examples: unirank run -n 4 train.py --lr 0.1 | unirank run --nproc_per_node gpu -m pkg.train"
    " | srun -N2 --ntasks-per-node=1 unirank run -n 4 train.py"
)


def _option(parser: argparse.ArgumentParser, *names: str, **kwargs: Any) -> None:
    """An option under its dashed and torchrun's underscored spellings."""
    spellings = list(names)
    for name in names:
        if name.startswith("--") and "-" in name[2:]:
            spellings.append("--" + name[2:].replace("-", "_"))
    parser.add_argument(*dict.fromkeys(spellings), **kwargs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``unirank run``: every option of torchrun 2.13, and unirank's own."""
    parser.epilog = _EPILOG
    _option(parser, "-n", "--nproc-per-node", dest="nproc_per_node", default=None,
            metavar="N|auto|gpu|cpu",
            help="workers on this node: a number, 'auto' (the default: under a launcher that "
            "started several processes per node, each is one rank; else the GPUs, or 1), "
            "'gpu' or 'cpu'")
    _option(parser, "--nnodes", default=None, metavar="N|MIN:MAX",
            help="number of nodes (default: from the outer launcher, else 1); a range MIN:MAX "
            "with the c10d rendezvous")
    _option(parser, "--node-rank", dest="node_rank", default=None, metavar="R",
            help="this node's rank (default: from the launcher; needed for several nodes "
            "without one)")
    _option(parser, "--master-addr", dest="master_addr", default=None, metavar="ADDR",
            help="host of rank 0 (default: the launcher's; else 127.0.0.1 on one node, "
            "MASTER_ADDR on several)")
    _option(parser, "--master-port", dest="master_port", default=None, metavar="PORT",
            help="rendezvous port (default: launcher, MASTER_PORT, or a free port on one node)")
    _option(parser, "--rdzv-backend", dest="rdzv_backend", default="static", metavar="NAME",
            help="static (node ranks given) or c10d (without --node-rank: node ranks "
            "assigned at rendezvous, unirank's dynamic rendezvous)")
    _option(parser, "--rdzv-endpoint", dest="rdzv_endpoint", default=None,
            metavar="HOST[:PORT]", help="node 0's host and port (as --master-addr/--master-port)")
    _option(parser, "--rdzv-id", dest="rdzv_id", default=None, metavar="ID",
            help="the job's id: TORCHELASTIC_RUN_ID and the log folder's name")
    _option(parser, "--rdzv-conf", dest="rdzv_conf", default=None, metavar="K=V,...",
            help="join_timeout, last_call_timeout, close_timeout (seconds; c10d), "
            "keep_alive_interval, keep_alive_max_attempt; join_timeout also sets the init "
            "timeout")
    _option(parser, "--standalone", action="store_true",
            help="one node on its own, with a free port (ignores outer launchers)")
    _option(parser, "--max-restarts", dest="max_restarts", default="0", metavar="N",
            help="on a failure, stop the workers and start them again, at most N times")
    _option(parser, "--init-timeout", dest="init_timeout", default=None, metavar="S",
            help="seconds for every rank to join before each fails naming the missing ones "
            "(default: UNIRANK_INIT_TIMEOUT, else 300)")
    _option(parser, "--hang-report-after", dest="hang_report_after", default=None, metavar="S",
            help="report a hang (ranks waiting S seconds in a collective that others have not "
            "entered) with every rank's stack; 0 or off: never (default: "
            "UNIRANK_HANG_REPORT_AFTER, else 60)")
    _option(parser, "--hang-timeout", dest="hang_timeout", default=None, metavar="S",
            help="end the job (exit code 86) when a hang lasts S seconds (default: "
            "UNIRANK_HANG_TIMEOUT, else never)")
    _option(parser, "--on-hang", dest="on_hang", default=None, metavar="exit|restart|evict",
            help="once --hang-timeout ended the workers: end the job (86), restart every "
            "node, or stop the nodes of the ranks that never entered the collective and go on "
            "without them (default: UNIRANK_ON_HANG, else evict in an elastic job with "
            "restarts left, restart with restarts left, else exit)")
    _option(parser, "--grace-period", "--shutdown-timeout", dest="grace_period", default=None,
            metavar="S", help="seconds between SIGTERM and SIGKILL when stopping workers "
            "(default 5)")
    _option(parser, "--signals-to-handle", dest="signals", default=None, metavar="SIG,...",
            help="signals forwarded to the workers (default SIGINT,SIGTERM,SIGUSR1,SIGUSR2)")
    _option(parser, "--role", default="default", help="the workers' ROLE_NAME")
    _option(parser, "-m", "--module", dest="module", action="store_true",
            help="run PROGRAM as a module, like python -m")
    _option(parser, "--no-python", dest="no_python", action="store_true",
            help="run PROGRAM itself, not with python")
    _option(parser, "--preload", default="", metavar="MODULE,...",
            help="modules the node's fork server imports, besides torch, before it forks the "
            "workers")
    _option(parser, "--no-preload", dest="no_preload", action="store_true",
            help="start every worker as its own interpreter, not forked from a server that "
            "imported torch once (also UNIRANK_NO_PRELOAD=1)")
    _option(parser, "--virtual-local-rank", dest="virtual_local_rank", action="store_true",
            help="LOCAL_RANK=0 in every worker, each seeing only its own GPU")
    _option(parser, "--tag-output", dest="tag_output", action="store_true",
            help="prefix every line of output with [rankN]:")
    _option(parser, "--timeline", action="store_true",
            help="after the job, print when each start-up phase was reached (min / median / "
            "max over ranks, the slowest rank and its node); rank 0's node prints it")
    _option(parser, "--timeline-json", dest="timeline_json", default=None, metavar="FILE",
            help="also write every rank's raw phase times to FILE (implies --timeline)")
    _option(parser, "--log-dir", dest="log_dir", default=None, metavar="DIR",
            help="log folder: DIR/RUN_ID/attempt_N/LOCAL_RANK/{stdout,stderr}.log, error.json")
    _option(parser, "-r", "--redirects", dest="redirects", default="0", metavar="0-3|R:V,...",
            help="send streams to their log file only: 1 stdout, 2 stderr, 3 both (per local "
            "rank: 0:3,1:1)")
    _option(parser, "-t", "--tee", dest="tee", default="0", metavar="0-3|R:V,...",
            help="send streams to their log file and to the console (as --redirects)")
    _option(parser, "--numa-binding", dest="numa_binding", default=None,
            metavar="node|socket|exclusive|core-complex",
            help="bind each worker to CPUs near its GPU (or, without GPUs, a share of the "
            "NUMA nodes by local rank), as torchrun does")
    _option(parser, "--local-ranks-filter", dest="local_ranks_filter", default=None,
            metavar="R,...", help="show only these local ranks' output on the console")
    for stream in ("stdout", "stderr"):
        _option(parser, f"--duplicate-{stream}-filters", dest=f"duplicate_{stream}_filters",
                default="", metavar="TEXT,...",
                help=f"copy the teed {stream} lines that hold one of these strings (,, is a "
                f"comma) into the attempt's filtered_{stream}.log, as torchrun")
    for name in _NOTED:
        takes_value = name not in _NOTED_FLAGS
        _option(parser, name, dest="noted_" + name[2:].replace("-", "_"),
                default=None, help=argparse.SUPPRESS,
                **({} if takes_value else {"action": "store_const", "const": "on"}))
    parser.add_argument("program", metavar="SCRIPT|MODULE", nargs="?",
                        help="the script (or module, or program) to run")
    parser.add_argument("program_args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="arguments for the script")
    from unirank.cli.sshrun import add_ssh_arguments

    add_ssh_arguments(parser)
    # the option strings that take a value: what unirank run --hosts strips from its own line
    parser.set_defaults(value_options=tuple(
        name for action in parser._actions if action.option_strings and action.nargs != 0
        for name in action.option_strings))


#: torchrun options accepted with a one-line note: what they do has no meaning here
_NOTED = {
    "--monitor-interval": "unirank run does not poll: it wakes on each worker's exit",
    "--start-method": "workers are always fresh processes (as torchrun's spawn)",
    "--event-log-handler": "torchelastic's event handlers live in torchrun's agent, which "
    "unirank run replaces",
    "--logs-specs": "a torchrun plugin for its agent; use --log-dir, --redirects and --tee",
    "--local-addr": "the static rendezvous needs only node 0's address",
    "--run-path": "scripts always run through runpy.run_path in a fresh worker",
}
_NOTED_FLAGS = {"--run-path"}


def _has_no_effect(name: str, args: argparse.Namespace, outer: DistEnv) -> bool:
    """Whether the noted option ``name`` has no effect here (the dynamic rendezvous uses
    ``--local-addr``)."""
    from unirank.cli import elastic

    return not (name in elastic.USED_OPTIONS and elastic.wanted(args, outer))


#: the planner's argument names as unirank run's options
_OPTION_NAMES = {"nproc_per_node": "--nproc-per-node", "nnodes": "--nnodes",
                 "node_rank": "--node-rank", "master_addr": "--master-addr",
                 "master_port": "--master-port", "max_restarts": "--max-restarts"}


def _detect(environ: Mapping[str, str]) -> DistEnv:
    from unirank.launchers import detect

    return detect(environ, sys.argv)


def _int_option(value: str | None, option: str, hint: str, least: int = 0) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ConfigError("is not an integer", variable=option, value=value, hint=hint) from None
    if number < least:
        raise ConfigError(f"must be at least {least}", variable=option, value=value, hint=hint)
    return number


def _endpoint(args: argparse.Namespace) -> tuple[str | None, int | None]:
    """``--rdzv-endpoint HOST[:PORT]`` merged with ``--master-addr``/``--master-port``."""
    from unirank.rendezvous import parse_port

    addr = args.master_addr.strip() if args.master_addr else None
    port = parse_port(args.master_port, "--master-port") if args.master_port else None
    if args.rdzv_endpoint:
        text = args.rdzv_endpoint.strip()
        host, sep, port_text = text.rpartition(":")
        if not sep or "]" in port_text or (host.count(":") and not host.endswith("]")):
            host, port_text = text, ""
        host = host.strip("[]")
        end_port = parse_port(port_text, "--rdzv-endpoint") if port_text else None
        for name, given, from_end in (("--master-addr", addr, host),
                                      ("--master-port", port, end_port)):
            if given is not None and from_end is not None and given != from_end:
                raise ConfigError(
                    f"disagrees with --rdzv-endpoint {text}", variable=name, value=str(given),
                    hint="give node 0's address once: --rdzv-endpoint HOST:PORT or "
                    "--master-addr/--master-port",
                )
        addr = addr or host or None
        port = port or end_port
    return addr, port


def _check_rdzv_backend(value: str) -> None:
    if value.strip().lower() not in ("static", "c10d"):
        raise ConfigError(
            "is not a rendezvous unirank run provides", variable="--rdzv-backend", value=value,
            hint="use static, or c10d (node ranks assigned at rendezvous without --node-rank)",
        )


def _rdzv_conf_timeout(args: argparse.Namespace, notes: list[str],
                       dynamic: bool) -> float | None:
    """``--rdzv-conf``'s join timeout (:func:`~unirank.supervisor.rdzv.conf.parse_rdzv_conf`);
    under the static rendezvous the other keys are noted as having no effect."""
    from unirank.supervisor.rdzv.conf import parse_rdzv_conf

    conf = parse_rdzv_conf(args.rdzv_conf)
    if not dynamic:
        notes.extend(f"--rdzv-conf {key} has no effect: node ranks are not assigned at "
                     "rendezvous here (c10d without --node-rank assigns them)"
                     for key in sorted(conf.given - {"join_timeout"}))
    return conf.join_timeout if "join_timeout" in conf.given else None


def _parse_signals(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    from unirank.signals import parse_signals

    return parse_signals(text, variable="--signals-to-handle", example="SIGTERM,SIGINT,SIGUSR1")


def build_request(args: argparse.Namespace, environ: Mapping[str, str],
                  notes: list[str] | None = None) -> LaunchRequest:
    """The validated :class:`LaunchRequest` for the parsed options.

    Reads: UNIRANK_INIT_TIMEOUT, CUDA_VISIBLE_DEVICES.
    """
    from unirank.cli import elastic
    from unirank.cli.counts import parse_nnodes, parse_nproc
    from unirank.contract import resolve_init_timeout
    from unirank.gpus import visible_gpu_count

    notes = [] if notes is None else notes
    nproc_text = "auto" if args.nproc_per_node is None else str(args.nproc_per_node)
    auto = nproc_text.strip().lower() == "auto"
    needs_gpus = nproc_text.strip().lower() in ("auto", "gpu")
    nproc = parse_nproc(
        nproc_text,
        gpu_count=visible_gpu_count(environ) if needs_gpus else 0,
        cpu_count=os.cpu_count(),
    )
    _check_rdzv_backend(str(args.rdzv_backend))
    addr, port = _endpoint(args)
    dynamic = elastic.wanted(args, _detect(environ))
    join_timeout = _rdzv_conf_timeout(args, notes, dynamic)
    init_timeout = (resolve_init_timeout(args.init_timeout, environ)
                    if args.init_timeout is not None or join_timeout is None
                    else resolve_init_timeout(join_timeout, environ,
                                              option="--rdzv-conf join_timeout"))
    from unirank.supervisor.plan import LaunchRequest

    return LaunchRequest(
        nproc_per_node=None if auto else nproc,
        spawn_default=nproc,
        nnodes=(parse_nnodes(args.nnodes) if args.nnodes is not None
                and not dynamic else None),
        node_rank=_int_option(args.node_rank, "--node-rank",
                              "give this node's rank, 0 to --nnodes - 1"),
        master_addr=addr,
        master_port=port,
        standalone=bool(args.standalone),
        init_timeout=init_timeout,
        max_restarts=_int_option(args.max_restarts, "--max-restarts",
                                 "give how many times to restart, 0 or more") or 0,
        run_id=args.rdzv_id or (elastic.DEFAULT_RUN_ID if dynamic else None),
        role=args.role,
        virtual_local_rank=bool(args.virtual_local_rank),
    )


def engine_options(args: argparse.Namespace,
                   environ: Mapping[str, str] | None = None) -> EngineOptions:
    """How to run the workers: grace period, signals, where their output goes, and the hang
    detector's settings.

    Reads: UNIRANK_HANG_REPORT_AFTER, UNIRANK_HANG_TIMEOUT, UNIRANK_HANG_INTERVAL.
    """
    from unirank.contract import DEFAULT_GRACE_PERIOD, parse_seconds, resolve_hang
    from unirank.supervisor.attempts import EngineOptions
    from unirank.supervisor.engine import DEFAULT_SIGNALS
    from unirank.supervisor.output import (
        TAG_TEMPLATE,
        OutputOptions,
        parse_filters,
        parse_ranks_filter,
        parse_std,
    )

    grace = (parse_seconds(str(args.grace_period), "--grace-period", allow_zero=True)
             if args.grace_period is not None else DEFAULT_GRACE_PERIOD)
    output = OutputOptions(
        prefix_template=TAG_TEMPLATE if args.tag_output else None,
        redirects=parse_std(str(args.redirects), "--redirects"),
        tee=parse_std(str(args.tee), "--tee"),
        log_dir=args.log_dir or None,
        ranks_filter=(parse_ranks_filter(args.local_ranks_filter)
                      if args.local_ranks_filter else None),
        stdout_filters=parse_filters(args.duplicate_stdout_filters or ""),
        stderr_filters=parse_filters(args.duplicate_stderr_filters or ""),
    )
    signals = _parse_signals(args.signals) or tuple(int(s) for s in DEFAULT_SIGNALS)
    hang = resolve_hang(getattr(args, "hang_report_after", None),
                        getattr(args, "hang_timeout", None), environ or {})
    return EngineOptions(grace_period=grace, output=output, signals=signals,
                         timeline=bool(args.timeline or args.timeline_json),
                         timeline_json=args.timeline_json or None, hang=hang,
                         numa_binding=_numa_binding(args.numa_binding),
                         on_hang=_on_hang(args, environ or {}))


def _on_hang(args: argparse.Namespace, environ: Mapping[str, str]) -> str:
    """``--on-hang`` (:func:`unirank.contract.resolve_on_hang`): an elastic job is a range of
    the dynamic rendezvous.

    Reads: UNIRANK_ON_HANG.
    """
    from unirank.cli import elastic
    from unirank.contract import resolve_on_hang

    restarts = _int_option(args.max_restarts, "--max-restarts", "give 0 or more") or 0
    return resolve_on_hang(getattr(args, "on_hang", None), environ, restarts=restarts,
                           elastic=elastic.wanted(args, _detect(environ))
                           and elastic.is_range(args))


def _numa_binding(mode: str | None) -> str | None:
    """``--numa-binding``, checked against this machine's topology (refused in one line where
    it has one NUMA node)."""
    if mode is None:
        return None
    from unirank import numa

    numa.check_binding(mode, numa.read_topology())
    return mode


def _preload(text: str, *, no_preload: bool) -> tuple[str, ...] | None:
    """``--preload``'s modules; None with ``--no-preload``."""
    modules = tuple(m.strip() for m in text.split(",") if m.strip())
    if no_preload:
        if modules:
            raise ConfigError("cannot be combined with --no-preload", variable="--preload",
                              value=text, hint="drop one of the two")
        return None
    for module in modules:
        if not all(part.isidentifier() for part in module.split(".")):
            raise ConfigError("is not a module name", variable="--preload", value=module,
                              hint="give importable module names, comma-separated, e.g. "
                              "--preload numpy,transformers")
    return modules


def target_of(args: argparse.Namespace) -> list[str]:
    """What follows the bootstrap: ``[SCRIPT, ARGS...]``, ``["-m", MODULE, ARGS...]`` or
    ``["--exec", PROGRAM, ARGS...]``."""
    program_args = list(args.program_args)
    if program_args and program_args[0] == "--":
        program_args = program_args[1:]
    if args.no_python:
        if args.module:
            raise ConfigError("cannot be combined with -m/--module", variable="--no-python",
                              value=None, hint="drop one of the two")
        return ["--exec", args.program, *program_args]
    if args.module:
        return ["-m", args.program, *program_args]
    return [args.program, *program_args]


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


def _refuse(error: ConfigError, request: LaunchRequest, outer: DistEnv) -> NoReturn:
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
            raise SystemExit(2) from None
        tell_others(*address, f"node {outer.node_name} refused to start its workers: {error}")
    raise SystemExit(2)


def _plan_and_run(args: argparse.Namespace, request: LaunchRequest, outer: DistEnv,
                  environ: Mapping[str, str], options: EngineOptions, target: list[str],
                  server: ForkServer | None) -> RunResult:
    """Plan this node's workers, then start and supervise them."""
    from dataclasses import replace
    from uuid import uuid4

    from unirank.cli import elastic
    from unirank.supervisor.attempts import run_plan
    from unirank.supervisor.plan import make_plan

    if elastic.wanted(args, outer):
        return _rendezvous_and_run(args, request, outer, environ, options, target, server)
    try:
        plan = make_plan(request, outer, environ, run_id_fallback=uuid4().hex)
    except ConfigError as exc:
        _refuse(exc.renamed(_OPTION_NAMES), request, outer)
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
    from dataclasses import replace

    from unirank.cli import elastic
    from unirank.supervisor.attempts import run_plan
    from unirank.supervisor.plan import make_plan

    nproc = request.nproc_per_node or request.spawn_default or 1
    helper, sock, assignment = elastic.join(args, _endpoint(args), nproc, outer, environ,
                                            restarts=request.max_restarts)

    def plan_at(place: Assignment) -> Plan:
        plan = make_plan(request, outer, environ, run_id_fallback=elastic.DEFAULT_RUN_ID,
                         assignment=place)
        return replace(plan, master_source="--rdzv-endpoint")

    places = [assignment]

    def replan(attempt: int, verdict: Mapping[str, Any] | None) -> Plan:
        """A restart: the next round (the world may change), the nodes of the ranks a hang
        verdict names evicted first (``--on-hang evict``)."""
        began = time.monotonic()
        places.append(helper.next(first=False, **elastic.eviction(places[-1], verdict)))
        line = elastic.describe_round(places[-2], places[-1], time.monotonic() - began,
                                      helper.noticed_before(began))
        print(f"unirank run: {line}", file=sys.stderr, flush=True)
        return plan_at(places[-1])

    try:
        plan = plan_at(assignment)
        # kept on every node: node rank 0 may move here (its node lost, the store moved)
        return run_plan(plan, target, environ=environ, options=options, server=server,
                        listening=sock, replan=replan, watch=helper)
    finally:
        helper.close()


def main(args: argparse.Namespace) -> int:
    """Plan, start and supervise this node's workers; returns the exit code."""
    if args.program is None:
        raise ConfigError(
            "no script or module to run",
            hint="unirank run [options] script.py [args...]  or  unirank run [options] -m module",
        )
    from unirank.cli.sshrun import check_ssh_only
    from unirank.cli.target import check_target

    check_ssh_only(args)
    environ = dict(os.environ)
    if args.from_ssh:  # a host of unirank run --hosts: its environment, then the watch
        from unirank.supervisor.ssh.stdinwatch import take_environ, watch_stdin

        received, stream = take_environ()
        environ.update(received)
        watch_stdin(stream)
    problem = check_target(args.program, module=args.module, no_python=args.no_python,
                           cwd=os.getcwd(), environ=environ)
    if problem is not None:  # as python says it, before any worker starts
        print(f"unirank run: {problem.message}", file=sys.stderr, flush=True)
        return problem.exit_code
    if args.hosts or args.hostfile:
        from unirank.cli.sshrun import main_hosts

        return main_hosts(args, environ)
    target = target_of(args)
    from unirank.supervisor.fork.client import start_server

    # first: it imports torch while this process plans
    server = start_server(target, environ, _preload(args.preload, no_preload=args.no_preload),
                          prog="unirank run")
    try:
        return _run(args, environ, target, server)
    finally:
        if server is not None:
            server.close()


def _run(args: argparse.Namespace, environ: dict[str, str], target: list[str],
         server: ForkServer | None) -> int:
    """Plan, start and supervise this node's workers (``server``: the node's fork server, if
    any); returns the exit code."""
    notes: list[str] = []
    request = build_request(args, environ, notes)
    options = engine_options(args, environ)
    outer = _detect(environ)
    notes += [f"{name} is accepted but has no effect: {why}" for name, why in _NOTED.items()
              if getattr(args, "noted_" + name[2:].replace("-", "_"), None) is not None
              and _has_no_effect(name, args, outer)]
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
                                      failure.error if failure is not None else ""))
        sys.stderr.flush()
    return result.exit_code
