"""``unirank run``'s options turned into what the run needs: the :class:`LaunchRequest` for the
planner (:func:`build_request`), the engine's :class:`EngineOptions` (:func:`engine_options`),
the worker's command line (:func:`target_of`). Pure but for the topology read of
``--numa-binding`` and the entry-point look-up of ``--logs-specs``.

Both builders first give the options not on the command line their ``PET_*`` values
(:func:`unirank.cli.runoptions.settle`), and a bad value taken from one is reported under the
variable's name.

Reads (from the mapping each is given): PET_* (:mod:`unirank.cli.runoptions`),
UNIRANK_INIT_TIMEOUT, CUDA_VISIBLE_DEVICES, TORCH_ELASTIC_SHUTDOWN_TIMEOUT,
TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, UNIRANK_STOP_SIGNALS, UNIRANK_HANG_REPORT_AFTER,
UNIRANK_HANG_TIMEOUT, UNIRANK_HANG_INTERVAL, UNIRANK_ON_HANG, and the launchers' variables
(the outer launcher, :func:`unirank.launchers.detect`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from unirank.cli.runoptions import NOTED, pet_names, settle
from unirank.errors import ConfigError

if TYPE_CHECKING:
    from unirank.distenv import DistEnv
    from unirank.supervisor.attempts import EngineOptions
    from unirank.supervisor.plan import LaunchRequest

__all__ = ["build_request", "endpoint", "engine_options", "grace_period", "noted_lines",
           "outer_launcher", "preload", "run_signals", "target_of"]


def _has_no_effect(name: str, args: argparse.Namespace, outer: DistEnv) -> bool:
    """Whether the noted option ``name`` has no effect here (the dynamic rendezvous uses
    ``--local-addr``)."""
    from unirank.cli import elastic

    return not (name in elastic.USED_OPTIONS and elastic.wanted(args, outer))


def noted_lines(args: argparse.Namespace, outer: DistEnv) -> list[str]:
    """The notes for the torchrun options given that have no effect here (``outer``: the
    launcher that started this ``unirank run``)."""
    return [f"{name} is accepted but has no effect: {why}" for name, why in NOTED.items()
            if getattr(args, "noted_" + name[2:].replace("-", "_"), None) is not None
            and _has_no_effect(name, args, outer)]


def outer_launcher(environ: Mapping[str, str]) -> DistEnv:
    """The launcher that started this ``unirank run`` (:func:`unirank.launchers.detect`)."""
    import sys

    from unirank.launchers import detect

    return detect(environ, sys.argv)


def _rdzv_conf_timeout(args: argparse.Namespace, notes: list[str],
                       dynamic: bool) -> float | None:
    """``--rdzv-conf``'s join timeout (:func:`~unirank.supervisor.rdzv.conf.parse_rdzv_conf`);
    under the static rendezvous the other keys are noted as having no effect, and torchrun's
    legacy ``timeout`` is the join timeout where ``join_timeout`` is not given; torchrun's
    store settings are noted as having no effect under both."""
    from unirank.supervisor.rdzv.conf import parse_rdzv_conf

    conf = parse_rdzv_conf(args.rdzv_conf)
    legacy = not dynamic and "join_timeout" not in conf.given and conf.legacy_timeout
    notes.extend(f"--rdzv-conf {key} has no effect: a setting of torch's c10d rendezvous "
                 "store, which unirank's rendezvous does not keep"
                 for key in sorted(conf.inert - ({"timeout"} if legacy else set())))
    if not dynamic:
        notes.extend(f"--rdzv-conf {key} has no effect: node ranks are not assigned at "
                     "rendezvous here (c10d without --node-rank assigns them)"
                     for key in sorted(conf.given - {"join_timeout"}))
    if legacy:
        return conf.legacy_timeout
    return conf.join_timeout if "join_timeout" in conf.given else None


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


def _endpoint_port(text: str, port_text: str) -> int:
    """The port of ``--rdzv-endpoint HOST:PORT``: 0 (a free one, torchrun's
    ``localhost:0``) to 65535; an error quotes the whole value."""
    try:
        port = int(port_text.strip())
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise ConfigError("has no port number 0..65535 after its last colon",
                          variable="--rdzv-endpoint", value=text,
                          hint="give HOST:PORT, e.g. node0:29500 (port 0: a free one)")
    return port


def endpoint(args: argparse.Namespace) -> tuple[str | None, int | None]:
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
        # port 0 (torchrun's localhost:0 for stacked one-node runs): a free one, as none
        end_port = (_endpoint_port(text, port_text) or None) if port_text else None
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


def _check_logs_specs(name: str | None) -> None:
    """``--logs-specs NAME``: accepted when a ``torchrun.logs_specs`` entry point NAME is
    installed (unirank keeps its own log layout), else refused as torchrun refuses it."""
    if name is None:
        return
    from importlib import metadata

    if not metadata.entry_points(group="torchrun.logs_specs", name=name):
        raise ConfigError("is no installed torchrun.logs_specs entry point",
                          variable="--logs-specs", value=name,
                          hint="drop it (unirank writes torchrun's default log layout), or "
                          "install the package that provides it",
                          exit_code=1)  # torchrun's (its ValueError)


def build_request(args: argparse.Namespace, environ: Mapping[str, str],
                  notes: list[str] | None = None, outer: DistEnv | None = None) -> LaunchRequest:
    """The validated :class:`LaunchRequest` for the parsed options; ``outer``: the launcher
    around this ``unirank run``, detected once by the caller (None: detected here).

    Reads: PET_*, UNIRANK_INIT_TIMEOUT, CUDA_VISIBLE_DEVICES.
    """
    settle(args, environ)
    outer = outer if outer is not None else outer_launcher(environ)
    try:
        return _build_request(args, environ, [] if notes is None else notes, outer)
    except ConfigError as exc:
        raise exc.renamed(pet_names(args)) from None


def _nproc(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[int, bool]:
    """The workers ``--nproc-per-node`` asks for, and whether it left the choice to the
    launcher (not given, or ``auto``). Given ``auto`` is torchrun's (the GPUs, else one per
    CPU); not given, the GPUs, else 1."""
    from unirank.cli.counts import parse_nproc
    from unirank.gpus import visible_gpu_count

    given = args.nproc_per_node
    text = "auto" if given is None else str(given)
    key = text.strip().lower()
    auto = key == "auto"
    gpus = visible_gpu_count(environ) if key in ("auto", "gpu") else 0
    if auto and given is not None and gpus == 0:
        text = "cpu"
    return parse_nproc(text, gpu_count=gpus, cpu_count=os.cpu_count()), auto


def _build_request(args: argparse.Namespace, environ: Mapping[str, str],
                   notes: list[str], outer: DistEnv) -> LaunchRequest:
    from unirank.cli import elastic
    from unirank.cli.counts import parse_nnodes
    from unirank.contract import default_max_restarts, resolve_init_timeout
    from unirank.supervisor.plan import LaunchRequest

    nproc, auto = _nproc(args, environ)
    _check_rdzv_backend(str(args.rdzv_backend))
    _check_logs_specs(args.logs_specs)
    addr, port = endpoint(args)
    dynamic = elastic.wanted(args, outer)
    join_timeout = _rdzv_conf_timeout(args, notes, dynamic)
    init_timeout = (resolve_init_timeout(args.init_timeout, environ)
                    if args.init_timeout is not None or join_timeout is None
                    else resolve_init_timeout(join_timeout, environ,
                                              option="--rdzv-conf join_timeout"))
    nnodes = parse_nnodes(args.nnodes) if args.nnodes is not None and not dynamic else None
    return LaunchRequest(
        nproc_per_node=None if auto else nproc,
        spawn_default=nproc,
        nnodes=nnodes,
        stacked=not ((nnodes or 1) > 1 or args.master_port is not None or args.rdzv_endpoint),
        node_rank=_int_option(args.node_rank, "--node-rank",
                              "give this node's rank, 0 to --nnodes - 1"),
        master_addr=addr,
        master_port=port,
        standalone=bool(args.standalone),
        init_timeout=init_timeout,
        max_restarts=default_max_restarts(
            _int_option(args.max_restarts, "--max-restarts",
                        "give how many times to restart, 0 or more"),
            elastic=_elastic(args, outer)),
        run_id=args.rdzv_id or (elastic.DEFAULT_RUN_ID if dynamic else None),
        role=args.role,
        virtual_local_rank=bool(args.virtual_local_rank),
    )


def grace_period(given: str | None, environ: Mapping[str, str]) -> float:
    """Seconds between SIGTERM and SIGKILL: ``--shutdown-timeout``, else
    TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30 (torchrun's).

    Reads: TORCH_ELASTIC_SHUTDOWN_TIMEOUT.
    """
    from unirank.contract import DEFAULT_GRACE_PERIOD, SHUTDOWN_TIMEOUT_VAR, parse_seconds

    if given is not None:
        return parse_seconds(str(given), "--grace-period", allow_zero=True)
    if environ.get(SHUTDOWN_TIMEOUT_VAR, "").strip():
        return parse_seconds(environ[SHUTDOWN_TIMEOUT_VAR], SHUTDOWN_TIMEOUT_VAR,
                             allow_zero=True)
    return DEFAULT_GRACE_PERIOD


def run_signals(text: str | None, environ: Mapping[str, str]) -> tuple[tuple[int, ...], str]:
    """The signals forwarded to the workers, and TORCHELASTIC_SIGNALS_TO_HANDLE's value (the
    option's text, as torchrun exports it):
    ``--signals-to-handle`` as given; without it :data:`unirank.signals.FORWARDED` (torchrun's
    SIGTERM,SIGINT,SIGHUP,SIGQUIT, SIGUSR1 and SIGUSR2) and the ranks' stop signals
    (UNIRANK_STOP_SIGNALS), so that ``ur.stop_requested()`` sees a Slurm warning signal; the
    variable's value stays torchrun's default text.

    Reads: UNIRANK_STOP_SIGNALS.
    """
    from unirank.signals import FORWARDED, HANDLED, format_signals, parse_signals, stop_signals

    if text is not None:
        return parse_signals(text, variable="--signals-to-handle",
                             example="SIGTERM,SIGINT,SIGUSR1"), text
    forwarded = (*(int(s) for s in FORWARDED), *(int(s) for s in stop_signals(environ)))
    return tuple(dict.fromkeys(forwarded)), format_signals(tuple(int(s) for s in HANDLED))


def engine_options(args: argparse.Namespace, environ: Mapping[str, str] | None = None,
                   outer: DistEnv | None = None) -> EngineOptions:
    """How to run the workers: grace period, signals, where their output goes, and the hang
    detector's settings; ``outer``: the launcher around this ``unirank run``, detected once by
    the caller (None: detected here).

    Reads: PET_*, TORCH_ELASTIC_SHUTDOWN_TIMEOUT, TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE,
    UNIRANK_STOP_SIGNALS, UNIRANK_HANG_REPORT_AFTER, UNIRANK_HANG_TIMEOUT,
    UNIRANK_HANG_INTERVAL, TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT.
    """
    environ = environ or {}
    settle(args, environ)
    outer = outer if outer is not None else outer_launcher(environ)
    try:
        return _engine_options(args, environ, outer)
    except ConfigError as exc:
        raise exc.renamed(pet_names(args)) from None


def _engine_options(args: argparse.Namespace, environ: Mapping[str, str],
                    outer: DistEnv) -> EngineOptions:
    from unirank.contract import LOG_LINE_PREFIX_VAR, resolve_hang
    from unirank.supervisor.attempts import EngineOptions
    from unirank.supervisor.dstate import dstate_timeout
    from unirank.supervisor.output import (
        TAG_TEMPLATE,
        OutputOptions,
        parse_filters,
        parse_ranks_filter,
        parse_std,
    )

    output = OutputOptions(
        prefix_template=TAG_TEMPLATE if args.tag_output else None,
        tee_prefix_template=environ.get(LOG_LINE_PREFIX_VAR) or None,
        redirects=parse_std(str(args.redirects), "--redirects"),
        tee=parse_std(str(args.tee), "--tee"),
        log_dir=args.log_dir or None,
        ranks_filter=(parse_ranks_filter(args.local_ranks_filter)
                      if args.local_ranks_filter else None),
        stdout_filters=parse_filters(args.duplicate_stdout_filters or ""),
        stderr_filters=parse_filters(args.duplicate_stderr_filters or ""),
    )
    signals, handled = run_signals(args.signals, environ)
    is_elastic = _elastic(args, outer)
    hang = resolve_hang(getattr(args, "hang_report_after", None),
                        getattr(args, "hang_timeout", None), environ,
                        elastic=is_elastic, on_slow=getattr(args, "on_slow", None))
    return EngineOptions(grace_period=grace_period(args.grace_period, environ), output=output,
                         signals=signals, signals_to_handle=handled,
                         timeline=bool(args.timeline or args.timeline_json),
                         timeline_json=args.timeline_json or None, hang=hang,
                         numa_binding=_numa_binding(args.numa_binding),
                         state_budget=_state_budget(getattr(args, "state_budget", None)),
                         on_hang=_on_hang(args, environ, is_elastic),
                         elastic=is_elastic, min_nodes=_min_nodes(args, is_elastic),
                         dstate_timeout=dstate_timeout(environ))


def _elastic(args: argparse.Namespace, outer: DistEnv) -> bool:
    """Whether this is an elastic job: a range of the dynamic rendezvous."""
    from unirank.cli import elastic

    return elastic.wanted(args, outer) and elastic.is_range(args)


def _min_nodes(args: argparse.Namespace, is_elastic: bool) -> int:
    """An elastic job's fewest nodes (``--nnodes MIN:MAX``); 1 for any other."""
    from unirank.cli.counts import parse_nnodes_range

    return parse_nnodes_range(str(args.nnodes))[0] if is_elastic else 1


def _on_hang(args: argparse.Namespace, environ: Mapping[str, str], is_elastic: bool) -> str:
    """``--on-hang`` (:func:`unirank.contract.resolve_on_hang`).

    Reads: UNIRANK_ON_HANG.
    """
    from unirank.contract import default_max_restarts, resolve_on_hang

    restarts = default_max_restarts(
        _int_option(args.max_restarts, "--max-restarts", "give 0 or more"), elastic=is_elastic)
    return resolve_on_hang(getattr(args, "on_hang", None), environ, restarts=restarts,
                           elastic=is_elastic)


def _state_budget(given: str | None) -> str | None:
    """``--state-budget``, checked here (refused in one line); None where not given (the
    workers read UNIRANK_STATE_BUDGET, else the default)."""
    if given is None:
        return None
    from unirank.statekeep.budget import parse_budget

    parse_budget(given, 1 << 30, variable="--state-budget")
    return given


def _numa_binding(mode: str | None) -> str | None:
    """``--numa-binding``, checked against this machine's topology (refused in one line where
    it has one NUMA node)."""
    if mode is None:
        return None
    from unirank import numa

    numa.check_binding(mode, numa.read_topology())
    return mode


def preload(text: str, *, no_preload: bool) -> tuple[str, ...] | None:
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
