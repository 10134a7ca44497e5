"""What ``unirank sbatch`` is asked to submit: :class:`JobSpec`, and the checks of its parts.

Everything here is pure: text in, values or a one-line :class:`~unirank.errors.ConfigError` out.
Nothing reads the environment or runs a program; the command line and ``--config`` file become
a JobSpec in :mod:`unirank.cli.sbatch`, and :mod:`unirank.sbatch.script` renders it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from unirank.contract import ELASTIC_MAX_RESTARTS, STOP_SIGNALS_VAR, default_max_restarts
from unirank.envvars import looks_secret
from unirank.errors import ConfigError
from unirank.gpus import COMMAND_BACKENDS, nccl_fits
from unirank.signals import (
    DEFAULT_WARNING,
    RANK_STOP,
    WARNING,
    parse_signal,
    parse_signals,
    signal_word,
)
from unirank.words import counted

__all__ = [
    "BACKENDS",
    "DEFAULT_REQUEUE_SIGNAL",
    "DEFAULT_SIGNAL_LEAD_S",
    "ELASTIC_MAX_RESTARTS",
    "LAUNCH_MODES",
    "EnvItem",
    "JobSpec",
    "check_spec",
    "parse_env",
    "parse_nodes",
    "parse_time",
    "parse_warning_signal",
    "rank_stop_signals",
    "signal_for_batch_shell",
    "warning_number",
]

LAUNCH_MODES = ("tasks", "node")
BACKENDS = COMMAND_BACKENDS
#: the warning signal's lead time with --requeue: long enough to save a checkpoint
DEFAULT_SIGNAL_LEAD_S = 120
#: the warning --requeue asks for when --signal is not given (USR2: NCCL may catch USR1)
DEFAULT_REQUEUE_SIGNAL = f"{signal_word(DEFAULT_WARNING)}@{DEFAULT_SIGNAL_LEAD_S}"
#: sbatch's own lead time when ``--signal`` names no ``@TIME``
SBATCH_SIGNAL_LEAD_S = 60

_TIME_HINT = "use MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (sbatch's formats)"
_TIME_FORMS = (
    (re.compile(r"(\d+)"), ("m",)),
    (re.compile(r"(\d+):(\d+)"), ("m", "s")),
    (re.compile(r"(\d+):(\d+):(\d+)"), ("h", "m", "s")),
    (re.compile(r"(\d+)-(\d+)"), ("d", "h")),
    (re.compile(r"(\d+)-(\d+):(\d+)"), ("d", "h", "m")),
    (re.compile(r"(\d+)-(\d+):(\d+):(\d+)"), ("d", "h", "m", "s")),
)
_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_SIGNAL = re.compile(r"(?:(?P<where>[RB]{1,2}):)?(?P<sig>[A-Za-z0-9]+)(?:@(?P<lead>\d+))?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LITERAL_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(?![\"']?\$)([^\s,;]+)")

EnvItem = tuple[str, Optional[str]]
"""``(NAME, VALUE)`` for ``--env NAME=VALUE``, ``(NAME, None)`` to pass NAME through."""


@dataclass(frozen=True)
class JobSpec:
    """One batch job: the layout, the ``#SBATCH`` options, and what each rank runs.

    ``tasks_per_node`` is the number of ranks on each node whatever ``launch`` is: with
    ``launch="node"`` (the default) one Slurm task per node runs ``unirank run --nproc-per-node
    tasks_per_node``, whose workers get torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT...), so that any torchrun script runs; with ``launch="tasks"`` each
    rank is a Slurm task running ``python SCRIPT``, which must find its rank from Slurm's
    variables (``ur.init`` does; ``dist.init_process_group()`` alone does not).
    ``cpus_per_task`` is per rank. ``signal`` is sbatch's ``[{R|B}:]SIG[@TIME]`` text; ``env``
    holds :data:`EnvItem`s. ``nodes`` is the number of nodes, or the most of an elastic range
    whose least is ``min_nodes`` (None: not a range).
    """

    program: str
    program_args: tuple[str, ...] = ()
    module: bool = False
    nodes: int = 1
    min_nodes: Optional[int] = None
    max_restarts: Optional[int] = None
    rdzv_conf: Optional[str] = None
    tasks_per_node: int = 1
    gpus_per_node: int = 0
    cpus_per_task: Optional[int] = None
    mem: Optional[str] = None
    time: Optional[str] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    job_name: Optional[str] = None
    output: Optional[str] = None
    error: Optional[str] = None
    constraint: Optional[str] = None
    requeue: bool = False
    signal: Optional[str] = None
    env: tuple[EnvItem, ...] = ()
    setup: tuple[str, ...] = ()
    launch: str = "node"
    sbatch_args: tuple[str, ...] = ()
    explicit_env: bool = False
    backend: str = "auto"
    python: str = "python"

    @property
    def elastic(self) -> bool:
        """Whether the job is elastic: ``--nnodes MIN:MAX`` with MIN below MAX."""
        return self.min_nodes is not None and self.min_nodes < self.nodes

    def nodes_text(self, sep: str = ":") -> str:
        """The node count as given: ``2``, or the range ``1:2`` (``sep`` between)."""
        return f"{self.min_nodes}{sep}{self.nodes}" if self.elastic else str(self.nodes)

    def restarts(self) -> Optional[int]:
        """unirank run's ``--max-restarts``: as given, else the elastic default
        (:func:`unirank.contract.default_max_restarts`) for an elastic job, else None."""
        if self.max_restarts is None and not self.elastic:
            return None
        return default_max_restarts(self.max_restarts, elastic=self.elastic)

    def warning_signal(self) -> Optional[str]:
        """The ``--signal`` the script asks for: as given, else the default with --requeue."""
        if self.signal is not None:
            return self.signal
        return DEFAULT_REQUEUE_SIGNAL if self.requeue else None

    def passed_names(self) -> tuple[str, ...]:
        """The names of ``--env NAME`` items, passed from the submitting shell."""
        return tuple(name for name, value in self.env if value is None)

    def set_values(self) -> tuple[tuple[str, str], ...]:
        """The ``--env NAME=VALUE`` items, written into the script."""
        return tuple((name, value) for name, value in self.env if value is not None)


def parse_nodes(text: object) -> tuple[int, Optional[int]]:
    """``--nnodes``: ``N``, or an elastic range ``MIN:MAX`` (sbatch's ``MIN-MAX`` too), as
    ``(MAX, MIN)``; MIN is None for a plain count (and for ``N:N``)."""
    from unirank.cli.counts import parse_nnodes_range

    raw = str(text).strip()
    try:
        least, most = parse_nnodes_range(raw.replace("-", ":", 1))
    except ConfigError as exc:
        raise ConfigError(exc.message, variable="--nodes", value=raw,
                          hint="give the number of nodes, N, or an elastic range MIN:MAX, "
                          "e.g. 1:2") from None
    return most, (least if least != most else None)


def parse_time(text: str) -> int:
    """sbatch's ``--time`` text as seconds (``0`` means no limit)."""
    stripped = text.strip()
    for pattern, units in _TIME_FORMS:
        match = pattern.fullmatch(stripped)
        if match:
            return sum(int(v) * _UNIT_S[u] for v, u in zip(match.groups(), units))
    raise ConfigError("is not a time limit", variable="--time", value=text, hint=_TIME_HINT)


def _signal_number(name: str, text: str) -> int:
    number = parse_signal(name, variable="--signal", value=text, example="USR2@120")
    if number not in WARNING:
        words = ", ".join(signal_word(s) for s in WARNING)
        raise ConfigError(
            f"{signal_word(number)} cannot be the job's warning: it must reach every rank as a "
            "stop signal that unirank run passes on and its helpers ignore",
            variable="--signal", value=text, hint=f"name one of {words}, e.g. USR2@120")
    return number


def warning_number(text: str) -> int:
    """The signal of sbatch's ``--signal`` text (already checked by
    :func:`parse_warning_signal`): ``USR1@300`` -> 10."""
    parse_warning_signal(text)
    match = _SIGNAL.fullmatch(text.strip())
    assert match is not None
    return _signal_number(match["sig"], text)


def parse_warning_signal(text: str) -> tuple[str, int]:
    """sbatch's ``--signal`` text checked: ``(normalised text, lead time in seconds)``.

    ``USR2@120`` -> ``("USR2@120", 120)``; ``B:TERM`` -> ``("B:TERM", 60)`` (sbatch's default
    lead when no ``@TIME`` is given).
    """
    match = _SIGNAL.fullmatch(text.strip())
    if match is None:
        raise ConfigError("is not sbatch's signal syntax", variable="--signal", value=text,
                          hint="write [{R|B}:]SIG[@SECONDS], e.g. USR2@120 or B:TERM@60")
    _signal_number(match["sig"], text)
    lead = int(match["lead"]) if match["lead"] else SBATCH_SIGNAL_LEAD_S
    if lead > 65535:
        raise ConfigError("lead time is above 65535 s, sbatch's limit", variable="--signal",
                          value=text, hint="give the seconds before the time limit, e.g. @120")
    return text.strip(), lead


def signal_for_batch_shell(text: str) -> Optional[str]:
    """The signal a ``B:`` (or ``RB:``) ``--signal`` sends to the batch shell alone, as
    ``kill`` names it (``USR2``, or the number of a signal without a name); None without
    ``B:``, when Slurm signals the job's steps (the ranks) itself."""
    match = _SIGNAL.fullmatch(text.strip())
    if match is None or "B" not in (match["where"] or ""):
        return None
    return signal_word(_signal_number(match["sig"], text))


def rank_stop_signals(spec: JobSpec) -> Optional[str]:
    """The UNIRANK_STOP_SIGNALS the script exports so that the job's warning signal is one of
    the ranks' stop signals (``ur.stop_requested()`` sees it; a rank does not die of it):
    ``USR1,TERM`` for ``--signal USR1@300``. None when the warning is among the ranks' default
    stop signals (:data:`unirank.signals.RANK_STOP`), there is no warning, or ``--env`` gives
    the variable (checked by :func:`check_spec`)."""
    warning = spec.warning_signal()
    if warning is None or any(name == STOP_SIGNALS_VAR for name, _value in spec.env):
        return None
    number = warning_number(warning)
    if number in RANK_STOP:
        return None
    # the warning replaces the default one; SIGTERM (Slurm's end of the run) stays
    kept = [int(s) for s in RANK_STOP if s != DEFAULT_WARNING]
    return ",".join(signal_word(s) for s in dict.fromkeys([number, *kept]))


def _secret_refusal(name: str, where: str) -> ConfigError:
    return ConfigError(
        f"{where} gives a value for {name}, which looks secret: Slurm keeps every batch "
        "script, readable by its admins (scontrol write batch_script)",
        hint=f"export {name} in this shell and pass it through with --env {name}",
    )


def parse_env(items: tuple[str, ...]) -> tuple[EnvItem, ...]:
    """``--env`` items as ``(NAME, VALUE)``/``(NAME, None)``; a later item for a name wins.

    A value for a name that :func:`unirank.envvars.looks_secret` is refused, its value never
    shown.
    """
    found: dict[str, Optional[str]] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not _NAME.fullmatch(name):
            raise ConfigError("is not NAME or NAME=VALUE", variable="--env",
                              value=name if sep else item,
                              hint="e.g. --env NCCL_DEBUG=INFO, or --env HF_TOKEN to pass "
                              "it from this shell")
        if sep and looks_secret(name):
            raise _secret_refusal(name, "--env")
        found.pop(name, None)
        found[name] = value if sep else None
    return tuple(found.items())


def _check_secrets(spec: JobSpec) -> None:
    """Refuse a literal secret-looking assignment in a --setup line or an --sbatch-arg."""
    for option, texts in (("--setup", spec.setup), ("--sbatch-arg", spec.sbatch_args)):
        for text in texts:
            for name, _value in _LITERAL_ASSIGN.findall(text):
                if looks_secret(name):
                    raise _secret_refusal(name, option)


def _check_gpus(spec: JobSpec) -> None:
    """Refuse ``--backend nccl`` where it does not fit (:func:`unirank.gpus.nccl_fits`: each
    rank sees the node's GPUs, bound to no task). ``auto`` is never refused: it picks nccl
    only where it fits, else gloo, as the runtime does."""
    if spec.backend != "nccl":
        return
    if not nccl_fits(spec.gpus_per_node, spec.tasks_per_node, per_task_gpus=False):
        raise ConfigError(
            f"{counted(spec.tasks_per_node, 'rank')} per node but "
            f"{counted(spec.gpus_per_node, 'GPU')} per node "
            "with nccl: nccl needs one GPU per rank",
            hint=f"give --gpus-per-node {spec.tasks_per_node}, or --ntasks-per-node "
            f"{max(1, spec.gpus_per_node)}, or --backend gloo",
        )


def _check_choices(spec: JobSpec) -> None:
    if spec.launch not in LAUNCH_MODES:
        raise ConfigError("is not a launch mode", variable="--launch", value=spec.launch,
                          hint="use tasks (one Slurm task per rank running python SCRIPT) or "
                          "node (one task per node running unirank run)")
    if spec.backend not in BACKENDS:
        raise ConfigError("is not a backend unirank sbatch checks", variable="--backend",
                          value=spec.backend, hint="use auto, gloo or nccl")
    for option, number, least in (("--nodes", spec.nodes, 1),
                                  ("--ntasks-per-node", spec.tasks_per_node, 1),
                                  ("--gpus-per-node", spec.gpus_per_node, 0),
                                  ("--cpus-per-task", spec.cpus_per_task, 1),
                                  ("--max-restarts", spec.max_restarts, 0)):
        if number is not None and number < least:
            raise ConfigError(f"must be at least {least}", variable=option, value=str(number),
                              hint=f"give a whole number, {least} or more")


def _check_elastic(spec: JobSpec) -> None:
    """An elastic range and ``--max-restarts`` need ``--launch node`` (unirank run on each
    node: in ``tasks`` mode no launcher stays to restart the ranks); ``--rdzv-conf`` needs an
    elastic range."""
    if spec.rdzv_conf is not None and not spec.elastic:
        raise ConfigError(
            "needs an elastic range (--nnodes MIN:MAX), whose nodes meet in torch's c10d "
            "rendezvous", variable="--rdzv-conf", value=spec.rdzv_conf,
            hint="give --nnodes MIN:MAX, or drop --rdzv-conf")
    if spec.rdzv_conf is not None:  # a typo refused now, not when the job starts
        from unirank.supervisor.rdzv.conf import parse_rdzv_conf

        parse_rdzv_conf(spec.rdzv_conf)
    if spec.launch == "node":
        return
    if spec.elastic:
        raise ConfigError(
            "is an elastic range, which needs --launch node (one unirank run per node, "
            "restarting the ranks at the world left)", variable="--nodes",
            value=spec.nodes_text(), hint=f"drop --launch tasks, or give one number of nodes, "
            f"e.g. --nodes {spec.nodes}")
    if spec.max_restarts is not None:
        raise ConfigError(
            "needs --launch node (with --launch tasks each rank is a Slurm task, which no "
            "launcher restarts)", variable="--max-restarts", value=str(spec.max_restarts),
            hint="add --launch node, or drop --max-restarts")


def _check_signal_lead(spec: JobSpec) -> None:
    warning = spec.warning_signal()
    if warning is None or spec.time is None:
        return
    _text, lead = parse_warning_signal(warning)
    limit = parse_time(spec.time)
    if limit and lead >= limit:
        raise ConfigError(
            f"the warning signal {warning} comes {lead} s before the time limit, but --time "
            f"{spec.time} is only {limit} s: the job would be warned as it starts",
            hint="give a longer --time or a shorter lead, e.g. --signal USR2@30",
        )


def _check_stop_signals(spec: JobSpec) -> None:
    """An ``--env UNIRANK_STOP_SIGNALS=...`` must hold the job's warning signal."""
    warning = spec.warning_signal()
    given = dict(spec.set_values()).get(STOP_SIGNALS_VAR)
    if warning is None or given is None:
        return
    number = warning_number(warning)
    if number not in parse_signals(given, variable=STOP_SIGNALS_VAR, example="USR2,TERM"):
        raise ConfigError(
            f"the ranks' stop signals leave out the job's warning signal {warning}, which "
            "would end a rank instead of asking it to stop", variable=STOP_SIGNALS_VAR,
            value=given, hint=f"add {signal_word(number)} to --env {STOP_SIGNALS_VAR}=..., or "
            "drop that --env (unirank sbatch exports the warning then)")


def check_spec(spec: JobSpec) -> JobSpec:
    """``spec`` when it can be submitted; else the ConfigError of its first problem.

    Checks the launch mode, backend, counts, time format, signal syntax and lead time, GPUs per
    rank with nccl, and secrets in ``--env``/``--setup``/``--sbatch-arg``.
    """
    _check_choices(spec)
    if spec.time is not None:
        parse_time(spec.time)
    if spec.signal is not None:
        parse_warning_signal(spec.signal)
    parse_env(tuple(name if value is None else f"{name}={value}" for name, value in spec.env))
    _check_secrets(spec)
    _check_gpus(spec)
    _check_elastic(spec)
    _check_signal_lead(spec)
    _check_stop_signals(spec)
    return spec
