"""The options of ``unirank run``: one table (:data:`OPTIONS`), read by the command line and by
:func:`settle`, which gives every torchrun option its default from ``PET_<DEST>`` as torchrun does.

Each :class:`RunOption` names its flags (the first long one is the canonical spelling; torchrun's
underscored spellings are added), argparse's ``dest``, its default, and ``pet``: torchrun's
``dest`` for the options torchrun reads from the environment (``torch.distributed.argparse_util``:
an option not on the command line takes ``PET_<PET>``, a flag ``bool(int(PET_<PET>))``), None
for unirank's own options and for the two torchrun reads only from its command line
(``--logs-specs``, ``--numa-binding``). The command line wins; a value taken from the
environment is recorded in ``args.option_sources`` (dest -> variable), printed as the run's first
line (:func:`describe_sources`) and named by the errors about it (:func:`pet_names`).

Reads (from the mapping :func:`settle` is given): ``PET_<PET>`` of every torchrun option.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from unirank.contract import (
    DEFAULT_GRACE_PERIOD,
    DEFAULT_HANG_REPORT_AFTER,
    DEFAULT_INIT_TIMEOUT,
    ELASTIC_MAX_RESTARTS,
    HANG_REPORT_AFTER_VAR,
    HANG_TIMEOUT_VAR,
    INIT_TIMEOUT_VAR,
    NO_PRELOAD_VAR,
    ON_HANG_VAR,
    ON_SLOW_VAR,
    PET_PREFIX,
    SHUTDOWN_TIMEOUT_VAR,
    STATE_BUDGET_VAR,
)
from unirank.errors import ConfigError
from unirank.hang.slowcost import PAYBACK_S
from unirank.signals import HANDLED, STOP_SIGNALS, format_signals
from unirank.statekeep.budget import DEFAULT_BUDGET

__all__ = ["NOTED", "OPTIONS", "RunOption", "add_run_options", "describe_sources",
           "environ_defaults", "pet_names", "settle"]

EPILOG = (
    "Examples: unirank run -n 4 train.py --lr 0.1 | unirank run --nproc_per_node gpu -m pkg.train"
    " | srun -N2 --ntasks-per-node=1 unirank run -n 4 train.py.  Every torchrun option not given"
    " takes its default from PET_<OPTION> (PET_NPROC_PER_NODE, PET_NNODES, ...), as torchrun's."
)

_GIVEN = "option_given"


class _Store(argparse.Action):
    """argparse's ``store`` that also records the dest as given on the command line."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.__dict__.setdefault(_GIVEN, set()).add(self.dest)


class _Joined(_Store):
    """:class:`_Store` for a comma-separated list: given again, the values add up
    (``--preload numpy --preload transformers`` preloads both)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if self.dest in namespace.__dict__.get(_GIVEN, set()):
            values = f"{getattr(namespace, self.dest)},{values}"
        super().__call__(parser, namespace, values, option_string)


class _Flag(argparse.Action):
    """argparse's ``store_const`` (a flag) that also records the dest as given."""

    def __init__(self, option_strings: Sequence[str], dest: str, const: Any = True,
                 default: Any = None, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, const=const, default=default,
                         help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, self.const)
        namespace.__dict__.setdefault(_GIVEN, set()).add(self.dest)


@dataclass(frozen=True)
class RunOption:
    """One option: its flags, argparse's ``dest``, default, torchrun's ``dest`` (``pet``)."""

    flags: tuple[str, ...]
    dest: str
    default: Any = None
    metavar: str | None = None
    help: str | None = None
    pet: str | None = None
    flag: bool = False
    #: the value a flag stores (True, or ``"on"`` for a noted flag)
    const: Any = True
    #: a comma-separated list whose values add up when the option is given again
    joined: bool = False

    @property
    def name(self) -> str:
        """The canonical spelling: the first long flag (``--nproc-per-node``)."""
        return next(f for f in self.flags if f.startswith("--"))

    @property
    def variable(self) -> str | None:
        """``PET_<PET>``, where torchrun reads this option from the environment."""
        return None if self.pet is None else PET_PREFIX + self.pet.upper()

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add it under its flags and torchrun's underscored spellings."""
        spellings = list(self.flags)
        for name in self.flags:
            if name.startswith("--") and "-" in name[2:]:
                spellings.append("--" + name[2:].replace("-", "_"))
        kwargs: dict[str, Any] = {"dest": self.dest, "default": self.default, "help": self.help}
        if self.flag:
            kwargs.update(action=_Flag, const=self.const)
        else:
            kwargs.update(action=_Joined if self.joined else _Store, metavar=self.metavar)
        parser.add_argument(*dict.fromkeys(spellings), **kwargs)


def _opt(*flags: str, dest: str | None = None, pet: str | bool = True, **kwargs: Any
         ) -> RunOption:
    """A row: ``dest`` defaults to the first long flag's; ``pet=True`` is torchrun's dest, the
    same; ``pet=False`` for an option torchrun does not read from the environment."""
    long = next(f for f in flags if f.startswith("--"))
    own = long[2:].replace("-", "_")
    torch_dest = own if pet is True else (pet or None)
    return RunOption(flags, dest or own, pet=torch_dest, **kwargs)


_SECONDS = "S"
_STD = "0-3|R:V,..."

#: torchrun options accepted with a one-line note: what they do has no meaning here
NOTED: dict[str, str] = {
    "--monitor-interval": "unirank run does not poll: it wakes on each worker's exit",
    "--start-method": "workers are always fresh processes (as torchrun's spawn)",
    "--event-log-handler": "torchelastic's event handlers live in torchrun's agent, which "
    "unirank run replaces",
    "--local-addr": "the static rendezvous needs only node 0's address",
    "--run-path": "scripts always run through runpy.run_path in a fresh worker",
}
_NOTED_FLAGS = frozenset({"--run-path"})


def _noted() -> tuple[RunOption, ...]:
    rows = []
    for name in NOTED:
        own = name[2:].replace("-", "_")
        flag = name in _NOTED_FLAGS
        rows.append(RunOption((name,), "noted_" + own, pet=own, help=argparse.SUPPRESS,
                              flag=flag, const="on"))
    return tuple(rows)


#: every option of ``unirank run`` (torchrun 2.13's and unirank's own), in ``--help``'s order
OPTIONS: tuple[RunOption, ...] = (
    _opt("-n", "--nproc-per-node", metavar="N|auto|gpu|cpu",
         help="workers on this node: a number; 'auto': the GPUs, else one per CPU (as torchrun); "
         "'gpu' or 'cpu'; not given: under a launcher that started several processes per "
         "node, each is one rank, else the GPUs, else 1"),
    _opt("--nnodes", metavar="N|MIN:MAX",
         help="number of nodes (default: from the outer launcher, else 1); a range MIN:MAX "
         "with the c10d rendezvous"),
    _opt("--node-rank", metavar="R",
         help="this node's rank (default: from the launcher; needed for several nodes "
         "without one)"),
    _opt("--master-addr", metavar="ADDR",
         help="host of rank 0 (default: the launcher's; else localhost on one node, "
         "MASTER_ADDR on several)"),
    _opt("--master-port", metavar="PORT",
         help="rendezvous port (default: launcher, MASTER_PORT, or a free port on one node)"),
    _opt("--rdzv-backend", default="static", metavar="NAME",
         help="static (node ranks given) or c10d (without --node-rank: node ranks "
         "assigned at rendezvous, unirank's dynamic rendezvous)"),
    _opt("--rdzv-endpoint", metavar="HOST[:PORT]",
         help="node 0's host and port (as --master-addr/--master-port; port 0: a free one)"),
    _opt("--rdzv-id", metavar="ID", help="the job's id: TORCHELASTIC_RUN_ID and the log "
         "folder's name"),
    _opt("--rdzv-conf", metavar="K=V,...",
         help="join_timeout, last_call_timeout, close_timeout (seconds; c10d), "
         "keep_alive_interval, keep_alive_max_attempt; join_timeout also sets the init "
         "timeout"),
    _opt("--standalone", flag=True, default=False,
         help="one node on its own, with a free port (ignores outer launchers)"),
    _opt("--max-restarts", metavar="N",
         help="on a failure (a lost node too), stop the workers and start them again, at most "
         f"N times; nodes joining spend none (default 0; {ELASTIC_MAX_RESTARTS} with a range "
         "--nnodes MIN:MAX)"),
    _opt("--init-timeout", pet=False, metavar=_SECONDS,
         help="seconds for every rank to join before each fails naming the missing ones "
         f"(default: {INIT_TIMEOUT_VAR}, else {DEFAULT_INIT_TIMEOUT:g})"),
    _opt("--state-budget", pet=False, metavar="SIZE|N%",
         help="how much of the node's shared memory the job's snapshots (ur.save_state) may "
         f"take: a size (8G) or a share of /dev/shm or of the memory available, the smaller "
         f"(default: {STATE_BUDGET_VAR}, else {DEFAULT_BUDGET.replace('%', '%%')})"),
    _opt("--hang-report-after", pet=False, metavar=_SECONDS,
         help="report a hang (ranks waiting S seconds in a collective that others have not "
         "entered) with every rank's stack; 0 or off: never (default: "
         f"{HANG_REPORT_AFTER_VAR}, else {DEFAULT_HANG_REPORT_AFTER:g})"),
    _opt("--hang-timeout", pet=False, metavar="S|auto|off",
         help=f"end the job (exit code 86) when a hang lasts S seconds; auto: when a rank "
         f"is stuck (not slow) past a timeout learned from the job's own waits (default: "
         f"{HANG_TIMEOUT_VAR}, else auto in an elastic job, never in a static one)"),
    _opt("--on-hang", pet=False, metavar="exit|restart|evict",
         help="once --hang-timeout ended the workers: end the job (86), restart every "
         "node, or stop the nodes of the ranks that never entered the collective and go on "
         f"without them (default: {ON_HANG_VAR}, else evict in an elastic job with "
         "restarts left, restart with restarts left, else exit)"),
    _opt("--on-slow", pet=False, metavar="warn|evict|replace",
         help="once a straggler is named (a rank that keeps the others waiting): say so "
         "only, or stop its node and go on without it where that repays a restart within "
         f"{PAYBACK_S / 60:g} minutes (an elastic job above its fewest nodes; a spare node "
         "waiting to join takes its place), or do so only where a spare waits (replace; "
         f"default: {ON_SLOW_VAR}, else warn)"),
    _opt("--grace-period", "--shutdown-timeout", dest="grace_period", pet="shutdown_timeout",
         metavar=_SECONDS,
         help="seconds between SIGTERM and SIGKILL when stopping workers (default: "
         f"{SHUTDOWN_TIMEOUT_VAR}, else {DEFAULT_GRACE_PERIOD:g})"),
    _opt("--signals-to-handle", dest="signals", metavar="SIG,...",
         help="signals forwarded to the workers (default torchrun's "
         f"{format_signals(tuple(HANDLED))}, and the ranks' stop signals); "
         f"{format_signals(tuple(STOP_SIGNALS))} stop them: no restart, SIGKILL after the "
         "grace period, exit code 128 + signal"),
    _opt("--role", default="default", help="the workers' ROLE_NAME"),
    _opt("-m", "--module", flag=True, default=False,
         help="run PROGRAM as a module, like python -m"),
    _opt("--no-python", flag=True, default=False,
         help="run PROGRAM itself, not with python"),
    _opt("--preload", pet=False, default="", metavar="MODULE,...", joined=True,
         help="modules the node's fork server imports, besides torch, before it forks the "
         "workers (given again, they add up)"),
    _opt("--no-preload", pet=False, flag=True, default=False,
         help="start every worker as its own interpreter, not forked from a server that "
         f"imported torch once (also {NO_PRELOAD_VAR}=1)"),
    _opt("--virtual-local-rank", flag=True, default=False,
         help="LOCAL_RANK=0 in every worker, each seeing only its own GPU"),
    _opt("--tag-output", pet=False, flag=True, default=False,
         help="prefix every line of output with [rankN]:"),
    _opt("--timeline", pet=False, flag=True, default=False,
         help="after the job, print when each start-up phase was reached (min / median / "
         "max over ranks, the slowest rank and its node); rank 0's node prints it"),
    _opt("--timeline-json", pet=False, metavar="FILE",
         help="also write every rank's raw phase times to FILE (implies --timeline)"),
    _opt("--log-dir", metavar="DIR",
         help="log folder: DIR/RUN_ID_XXXXXXXX/attempt_N/LOCAL_RANK/{stdout,stderr}.log, "
         "error.json (a new folder each run)"),
    _opt("-r", "--redirects", default="0", metavar=_STD,
         help="send streams to their log file only: 1 stdout, 2 stderr, 3 both (per local "
         "rank: 0:3,1:1)"),
    _opt("-t", "--tee", default="0", metavar=_STD,
         help="send streams to their log file and to the console (as --redirects; tee wins)"),
    _opt("--numa-binding", pet=False, metavar="node|socket|exclusive|core-complex",
         help="bind each worker to CPUs near its GPU (or, without GPUs, a share of the "
         "NUMA nodes by local rank), as torchrun does"),
    _opt("--local-ranks-filter", metavar="R,...",
         help="show only these local ranks' output on the console"),
    *(_opt(f"--duplicate-{stream}-filters", default="", metavar="TEXT,...",
           help=f"copy the teed {stream} lines that hold one of these strings (,, is a "
           f"comma) into the attempt's filtered_{stream}.log, as torchrun")
      for stream in ("stdout", "stderr")),
    _opt("--logs-specs", pet=False, metavar="NAME",
         help="a torchrun.logs_specs entry point; accepted when installed (unirank keeps its "
         "own log layout), refused otherwise"),
    *_noted(),
)


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Add every option of :data:`OPTIONS` to ``parser``, in its order."""
    parser.epilog = EPILOG
    for option in OPTIONS:
        option.add_to(parser)


def _from_environ(option: RunOption, text: str) -> Any:
    """A flag's value from its PET variable, as torchrun's ``check_env``: ``bool(int(text))``."""
    if not option.flag:
        return text
    try:
        on = bool(int(text))
    except ValueError:
        raise ConfigError("is not an integer", variable=option.variable, value=text,
                          hint=f"set it to 1 to turn {option.name} on, 0 to leave it off"
                          ) from None
    return option.const if on else option.default


def settle(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """Give every torchrun option not on the command line its ``PET_*`` value from
    ``environ``, as torchrun does; returns (and keeps in ``args.option_sources``) dest ->
    variable for the values so taken. Idempotent: a second call changes nothing.

    Reads (from ``environ``): PET_<OPTION> for every torchrun option.
    """
    sources: dict[str, str] | None = getattr(args, "option_sources", None)
    if sources is not None:
        return sources
    given: set[str] = getattr(args, _GIVEN, set())
    sources = {}
    for option in OPTIONS:
        variable = option.variable
        if variable is None or option.dest in given or variable not in environ:
            continue
        value = _from_environ(option, environ[variable])
        if option.flag and value == option.default:
            continue
        setattr(args, option.dest, value)
        sources[option.dest] = variable
    args.option_sources = sources
    return sources


def environ_defaults(environ: Mapping[str, str]) -> list[str]:
    """``unirank run``'s options that ``environ``'s PET_* variables set, as
    ``--option value (PET_NAME)``: what ``unirank info`` shows.

    Reads (from ``environ``): PET_<OPTION> for every torchrun option.
    """
    return [f"{option.name} {environ[option.variable]} ({option.variable})"
            for option in OPTIONS if option.variable is not None and option.variable in environ]


def pet_names(args: argparse.Namespace) -> dict[str, str]:
    """Option spellings -> the PET variable their value came from, for
    :meth:`ConfigError.renamed`."""
    sources = getattr(args, "option_sources", None) or {}
    return {option.name: sources[option.dest] for option in OPTIONS if option.dest in sources}


def describe_sources(args: argparse.Namespace) -> str | None:
    """One line naming the options taken from the environment, or None when none was."""
    sources = getattr(args, "option_sources", None) or {}
    parts = []
    for option in OPTIONS:
        if option.dest in sources:
            value = getattr(args, option.dest)
            shown = option.name if option.flag else f"{option.name} {value}"
            parts.append(f"{shown} ({sources[option.dest]})")
    if not parts:
        return None
    return "from the environment: " + ", ".join(parts)
