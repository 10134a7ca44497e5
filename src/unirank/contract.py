"""The environment contract: every variable unirank reads or writes, its default and its parser.

One home, so that ``unirank run``, :class:`~unirank.runtime.parallel.Parallel`, the worker
bootstrap and :func:`unirank.init` agree. No torch here.

torchrun's worker contract (what every worker that unirank starts gets, exactly as torchrun
sets it): RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID,
TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_USE_AGENT_STORE,
TORCHELASTIC_ERROR_FILE, TORCHELASTIC_SIGNALS_TO_HANDLE, TORCH_NCCL_ASYNC_ERROR_HANDLING and
OMP_NUM_THREADS.

unirank's own user-facing variables: UNIRANK_INIT_TIMEOUT, UNIRANK_NO_SRUN, UNIRANK_LAUNCHER,
UNIRANK_STOP_SIGNALS, UNIRANK_MAX_REQUEUES, and the hang detector's UNIRANK_HANG_REPORT_AFTER,
UNIRANK_HANG_TIMEOUT and UNIRANK_HANG_INTERVAL (:func:`resolve_hang`).
``unirank run`` marks the srun step it starts from an allocation shell with UNIRANK_SRUN_REEXEC,
and gives every worker UNIRANK_NODE_NAME, its node's name (kept for the program, so that the
worker's own detection names the node as its supervisor did), and the workers of a restarted
attempt UNIRANK_RESTART_REASON (why the attempt before ended, for :func:`unirank.elastic_state`;
kept for the program), and in an elastic job UNIRANK_ELASTIC (kept: :func:`unirank.init`'s
``on_hang=`` reads it). The bootstrap's private variables
(:data:`PRIVATE_VARIABLES`) are removed before the user's program starts. Every ``UNIRANK_*``
name is defined here and nowhere else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from unirank.errors import ConfigError

__all__ = [
    "ATTEMPT_DIR_VAR",
    "DEFAULT_GRACE_PERIOD",
    "DEFAULT_HANG_REPORT_AFTER",
    "DEFAULT_INIT_TIMEOUT",
    "DEFAULT_MAX_REQUEUES",
    "DONE_FD_VAR",
    "ELASTIC_MAX_RESTARTS",
    "ELASTIC_VAR",
    "ENABLE_FILE_TIMER_VAR",
    "ERROR_FILE_VAR",
    "EXIT_TIMEOUT_VAR",
    "FAULT_FILE_VAR",
    "HANG_INTERVAL_VAR",
    "HANG_KEYWORDS",
    "HANG_NAMES_VAR",
    "HANG_OPTIONS",
    "HANG_REPORT_AFTER_VAR",
    "HANG_TIMEOUT_AUTO",
    "HANG_TIMEOUT_VAR",
    "INIT_TIMEOUT_VAR",
    "LAUNCHER_VAR",
    "LEARNED_INTERVAL",
    "LINGER_FD_VAR",
    "LOG_LINE_PREFIX_VAR",
    "LOST_PEER_WAIT",
    "MASTER_FORWARDED_VAR",
    "MAX_REQUEUES_VAR",
    "MAX_RESTARTS_VAR",
    "NODE_NAMES_VAR",
    "NODE_NAME_VAR",
    "NO_PRELOAD_VAR",
    "NO_SRUN_VAR",
    "NUMA_BINDING_VAR",
    "ON_HANG_CHOICES",
    "ON_HANG_VAR",
    "ON_SLOW_CHOICES",
    "ON_SLOW_VAR",
    "PET_PREFIX",
    "PRIVATE_VARIABLES",
    "RANKS_PER_NODE_VAR",
    "RDZV_SECRET_FILE_VAR",
    "RDZV_SECRET_VAR",
    "RESTART_COUNT_VAR",
    "RESTART_REASON_VAR",
    "RUN_ID_VAR",
    "SHUTDOWN_TIMEOUT_VAR",
    "SIGNALS_TO_HANDLE_VAR",
    "SRUN_REEXEC_VAR",
    "STATE_BUDGET_VAR",
    "STATE_DIR_VAR",
    "STATE_MEMORY_VAR",
    "STATE_SHM_VAR",
    "STOP_SIGNALS_VAR",
    "STORE_FD_VAR",
    "SUPERVISOR_PID_VAR",
    "TIMELINE_FILE_VAR",
    "TIMELINE_VAR",
    "TIMER_FILE_VAR",
    "UNINTERRUPTIBLE_TIMEOUT_VAR",
    "USE_AGENT_STORE_VAR",
    "HangSettings",
    "default_max_restarts",
    "flag",
    "format_seconds",
    "given_as",
    "on_hang_now",
    "on_slow_now",
    "parse_seconds",
    "resolve_hang",
    "resolve_init_timeout",
    "resolve_on_hang",
    "resolve_on_slow",
    "shown_setting",
]

# -- torchrun's variables ---------------------------------------------------------------------
ERROR_FILE_VAR = "TORCHELASTIC_ERROR_FILE"
RESTART_COUNT_VAR = "TORCHELASTIC_RESTART_COUNT"
MAX_RESTARTS_VAR = "TORCHELASTIC_MAX_RESTARTS"
RUN_ID_VAR = "TORCHELASTIC_RUN_ID"
USE_AGENT_STORE_VAR = "TORCHELASTIC_USE_AGENT_STORE"
#: the signals the launcher forwards to its workers, by name (torchrun exports its option)
SIGNALS_TO_HANDLE_VAR = "TORCHELASTIC_SIGNALS_TO_HANDLE"
#: torchrun's launcher options: one not on the command line takes ``PET_<DEST>``
#: (``torch.distributed.argparse_util``; :mod:`unirank.cli.runoptions`)
PET_PREFIX = "PET_"
#: seconds between SIGTERM and SIGKILL when no ``--shutdown-timeout`` is given (torchrun's)
SHUTDOWN_TIMEOUT_VAR = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
#: the template of a teed line's prefix (``[${role_name}${local_rank}]:``), as torchrun's
LOG_LINE_PREFIX_VAR = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
#: ``1``: serve torchelastic's file-based watchdog (:mod:`unirank.supervisor.filetimer`)
ENABLE_FILE_TIMER_VAR = "TORCHELASTIC_ENABLE_FILE_TIMER"
#: the watchdog's named pipe, given to the workers (torch's ``FileTimerClient`` writes to it)
TIMER_FILE_VAR = "TORCHELASTIC_TIMER_FILE"
#: seconds a worker may stay in uninterruptible sleep (D state) before the attempt ends, with no
#: restart (:mod:`unirank.supervisor.dstate`; torchrun 2.13's agent)
UNINTERRUPTIBLE_TIMEOUT_VAR = "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT"

# -- unirank's user-facing variables ----------------------------------------------------------
INIT_TIMEOUT_VAR = "UNIRANK_INIT_TIMEOUT"
#: ``<name>`` forces a launcher (:mod:`unirank.launchers`), ``none`` turns detection off
LAUNCHER_VAR = "UNIRANK_LAUNCHER"
#: ``1``: ``unirank run`` in an allocation shell fails with the srun command instead of running it
NO_SRUN_VAR = "UNIRANK_NO_SRUN"
#: set by ``unirank run`` in the srun step it starts from an allocation shell
SRUN_REEXEC_VAR = "UNIRANK_SRUN_REEXEC"
#: the node's name as the supervisor knows it (see :func:`unirank.launchers.node_name`)
NODE_NAME_VAR = "UNIRANK_NODE_NAME"
#: a restarted attempt's workers: why the attempt before ended, one JSON object
#: (:mod:`unirank.elasticstate`)
RESTART_REASON_VAR = "UNIRANK_RESTART_REASON"
#: the signals that ask the ranks to stop (``USR2,TERM``; see :func:`unirank.signals.stop_signals`)
STOP_SIGNALS_VAR = "UNIRANK_STOP_SIGNALS"
#: how many times a Slurm job may be requeued (``SLURM_RESTART_COUNT``) before it stops failing
MAX_REQUEUES_VAR = "UNIRANK_MAX_REQUEUES"
#: the job's rendezvous secret (:mod:`unirank.supervisor.rdzv.secret`): every node of one job
#: the same; a node without it is refused, and no message without it steers the job
RDZV_SECRET_VAR = "UNIRANK_RDZV_SECRET"
#: a file that holds it, which other users cannot read (mode 600, or 640 for its group)
RDZV_SECRET_FILE_VAR = "UNIRANK_RDZV_SECRET_FILE"
#: ``1``: every worker starts as its own interpreter (``unirank run --no-preload``), not forked
#: from the node's preloading fork server
NO_PRELOAD_VAR = "UNIRANK_NO_PRELOAD"
#: ``1``: the master address reaches this host through a forwarding (NAT, a virtual or cloud
#: public address) though it is none of its interfaces' addresses: the store host's check that
#: the address is its own (:func:`unirank.resolve.require_own`) is skipped
MASTER_FORWARDED_VAR = "UNIRANK_MASTER_FORWARDED"
#: seconds a rank may wait in a collective that another rank has not entered before the hang
#: detector reports it (``--hang-report-after``; ``0`` or ``off``: no detector)
HANG_REPORT_AFTER_VAR = "UNIRANK_HANG_REPORT_AFTER"
#: seconds of such a hang after which the job ends (``--hang-timeout``; ``auto``: learned from
#: the job, :mod:`unirank.hang.learned`, the default of an elastic job; unset: never)
HANG_TIMEOUT_VAR = "UNIRANK_HANG_TIMEOUT"
#: the value of UNIRANK_HANG_TIMEOUT / ``--hang-timeout`` that asks for the learned timeout
HANG_TIMEOUT_AUTO = "auto"
#: what the supervisor does when ``--hang-timeout`` ends the workers (``--on-hang``): ``exit``
#: (the job ends, 86), ``restart`` (every node starts its workers again), ``evict`` (the nodes of
#: the ranks that never entered the collective are stopped and left out; an elastic job only)
ON_HANG_VAR = "UNIRANK_ON_HANG"
ON_HANG_CHOICES = ("exit", "restart", "evict")
#: what a straggler leads to (``--on-slow``): ``warn`` (named, nothing else), ``evict`` (its
#: node is stopped and left out where that pays: :mod:`unirank.hang.slowcost`; an elastic job
#: only, and only while it has more nodes than its minimum) or ``replace`` (the same, only
#: where a spare node waits to take its place: the world keeps its size)
ON_SLOW_VAR = "UNIRANK_ON_SLOW"
ON_SLOW_CHOICES = ("warn", "evict", "replace")
#: ``1`` in a worker of an elastic job (``--nnodes MIN:MAX`` of the dynamic rendezvous): the
#: ``on_hang="evict"`` keyword of :func:`unirank.init` is allowed there (kept in the program's
#: environment, as the keyword is read there)
ELASTIC_VAR = "UNIRANK_ELASTIC"
#: seconds between two progress records of a rank (default: a quarter of the report delay,
#: 0.25 to 5 s)
HANG_INTERVAL_VAR = "UNIRANK_HANG_INTERVAL"
#: the names unirank run gives the two hang settings, and the keywords of ``ur.init``,
#: ``ur.Parallel`` and ``ur.launch``: a report names a setting as it was given
HANG_OPTIONS = ("--hang-report-after", "--hang-timeout")
HANG_KEYWORDS = ("hang_report_after", "hang_timeout")
#: the default of UNIRANK_HANG_REPORT_AFTER
DEFAULT_HANG_REPORT_AFTER = 60.0
#: the default of UNIRANK_MAX_REQUEUES
DEFAULT_MAX_REQUEUES = 10
#: seconds every rank waits for the others to join when nothing else says how long
DEFAULT_INIT_TIMEOUT = 300.0
#: seconds between SIGTERM and SIGKILL when workers are stopped (``--grace-period``, else
#: TORCH_ELASTIC_SHUTDOWN_TIMEOUT): torchrun's 30
DEFAULT_GRACE_PERIOD = 30.0
#: seconds after the SIGTERM of a change of the world that lost a node (not nodes joining) at
#: which a worker still waiting in a collective (:class:`unirank.hang.waits.CollectiveMark`)
#: gets SIGKILL, not at the grace period's end: the collective waits for the node that is
#: gone, and holds the main thread, where the program's stop handler would run
#: (:mod:`unirank.supervisor.stoppolicy`); looked at again as often until the grace period ends
LOST_PEER_WAIT = 2.0
#: ``--max-restarts`` of an elastic job (``--nnodes MIN:MAX``) when none is given, for every
#: front door (``unirank run``, ``--hosts``, ``unirank sbatch``): a range says the job should
#: outlive a node, and each lost node spends a restart (its peers' collective fails, as under
#: torchrun), while nodes joining spend none; a static job keeps torchrun's 0
ELASTIC_MAX_RESTARTS = 3

# -- the bootstrap's private variables (set by the supervisor, removed before the program) ----
SUPERVISOR_PID_VAR = "UNIRANK_SUPERVISOR_PID"
STORE_FD_VAR = "UNIRANK_STORE_FD"
NODE_NAMES_VAR = "UNIRANK_NODE_NAMES"
#: the ranks on each node, in node-rank order, in Slurm's task-count form (``2(x3),1``)
RANKS_PER_NODE_VAR = "UNIRANK_RANKS_PER_NODE"
#: seconds node 0's store waits, at the end of a multi-node job, for the other nodes' ranks
EXIT_TIMEOUT_VAR = "UNIRANK_EXIT_TIMEOUT"
#: a pipe the store's host reads at its end: EOF once its node's other workers have ended
LINGER_FD_VAR = "UNIRANK_LINGER_FD"
#: a pipe every other worker closes when its program ends (before the interpreter's teardown)
DONE_FD_VAR = "UNIRANK_DONE_FD"
#: ``--timeline``: the time the supervisor started this worker (set only when on)
TIMELINE_VAR = "UNIRANK_TIMELINE"
#: rank 0 only: where to write every rank's gathered end-of-run record (``--timeline``'s times,
#: the time in collectives)
TIMELINE_FILE_VAR = "UNIRANK_TIMELINE_FILE"
#: where the worker's faulthandler writes the Python stack of a fatal signal (SIGSEGV, ...)
FAULT_FILE_VAR = "UNIRANK_FAULT_FILE"
#: the worker's attempt folder (:mod:`unirank.runfolder`): where rank 0's hang reports and the
#: detector's mark go; kept in the program's environment (never derived from the error file)
ATTEMPT_DIR_VAR = "UNIRANK_ATTEMPT_DIR"
#: the node's snapshot memory (:mod:`unirank.statekeep.memory`): ``unirank run`` makes it for
#: the run and tells every worker; ``ur.save_state`` and DCP's unirank storage write there
STATE_MEMORY_VAR = "UNIRANK_STATE_MEMORY"
#: where the node's snapshot memory is made (default ``/dev/shm``; a test's own folder)
STATE_SHM_VAR = "UNIRANK_STATE_SHM"
#: the disk folder of ``ur.save_state`` / ``ur.load_state`` where the program names none
STATE_DIR_VAR = "UNIRANK_STATE_DIR"
#: the node's snapshot memory's budget (``50%`` of ``/dev/shm``, ``8G``: ``--state-budget``)
STATE_BUDGET_VAR = "UNIRANK_STATE_BUDGET"
#: ``--numa-binding``: ``MODE LOCAL_RANK/LOCAL_WORLD_SIZE`` (the supervisor's own numbers)
NUMA_BINDING_VAR = "UNIRANK_NUMA_BINDING"
#: ``NAME,NAME``: how the two hang settings were given (:data:`HANG_OPTIONS`,
#: :data:`HANG_KEYWORDS` for ``ur.launch(hang_timeout=6)``, a variable's name), what the
#: workers' reports call them
HANG_NAMES_VAR = "UNIRANK_HANG_NAMES"
#: the hang detector's settings (``--on-slow``'s too) are user-facing (``unirank run`` and
#: :func:`unirank.init` read them), but in a worker that ``unirank run`` starts its bootstrap
#: reads them and removes them
PRIVATE_VARIABLES = (SUPERVISOR_PID_VAR, STORE_FD_VAR, NODE_NAMES_VAR, RANKS_PER_NODE_VAR,
                     EXIT_TIMEOUT_VAR, LINGER_FD_VAR, DONE_FD_VAR, TIMELINE_VAR,
                     TIMELINE_FILE_VAR, FAULT_FILE_VAR, NUMA_BINDING_VAR, HANG_REPORT_AFTER_VAR,
                     HANG_TIMEOUT_VAR, HANG_INTERVAL_VAR, HANG_NAMES_VAR, ON_SLOW_VAR)


def flag(environ: Mapping[str, str], name: str) -> bool:
    """THE reading of unirank's on/off variables (UNIRANK_NO_PRELOAD, UNIRANK_NO_SRUN,
    UNIRANK_MASTER_FORWARDED, UNIRANK_ELASTIC, UNIRANK_SRUN_REEXEC): on when set to anything
    but ``""`` or ``0`` (spaces around it ignored), so ``1``, ``yes`` and ``true`` all turn it
    on. torchrun's own (TORCHELASTIC_ENABLE_FILE_TIMER: ``1``; TORCHELASTIC_USE_AGENT_STORE:
    ``True``) keep torchrun's reading."""
    return environ.get(name, "").strip() not in ("", "0")


def format_seconds(value: float) -> str:
    """``300`` or ``2.5``: a duration as an environment value."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def parse_seconds(value: str, variable: str, *, allow_zero: bool = False) -> float:
    """A duration in seconds (a positive number, or zero when ``allow_zero``), else ConfigError
    naming ``variable``."""
    least = "0 or more" if allow_zero else "more than 0"
    try:
        seconds = float(value.strip())
    except ValueError:
        raise ConfigError("is not a number of seconds", variable=variable, value=value,
                          hint=f"give a number of seconds, {least}") from None
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise ConfigError(f"must be a finite number of seconds, {least}", variable=variable,
                          value=value, hint=f"give a number of seconds, {least}")
    return seconds


def resolve_init_timeout(
    given: str | float | None, environ: Mapping[str, str], *, option: str = "--init-timeout"
) -> float:
    """The init timeout: ``given`` (an option's text or a number), else UNIRANK_INIT_TIMEOUT,
    else 300 s. A bad value in either place is a ConfigError naming where it came from.

    Reads: UNIRANK_INIT_TIMEOUT.
    """
    if given is not None:
        if isinstance(given, bool):
            raise ConfigError("must be a number of seconds", variable=option, value=str(given),
                              hint="give a number of seconds, more than 0")
        return parse_seconds(str(given), option)
    text = environ.get(INIT_TIMEOUT_VAR)
    if text is not None and text.strip():
        return parse_seconds(text, INIT_TIMEOUT_VAR)
    return DEFAULT_INIT_TIMEOUT


@dataclass(frozen=True)
class HangSettings:
    """The hang detector's settings (see :mod:`unirank.hang`)."""

    #: seconds before a hang is reported; None: the detector is off
    report_after: float | None = DEFAULT_HANG_REPORT_AFTER
    #: seconds of hang after which the job ends; None: never (or learned, below)
    timeout: float | None = None
    #: seconds between two progress records of a rank
    interval: float = 5.0
    #: the names ``report_after`` and ``timeout`` were given by: :data:`HANG_OPTIONS`,
    #: :data:`HANG_KEYWORDS` or a variable's name; what the reports name them
    names: tuple[str, str] = HANG_OPTIONS
    #: the timeout is learned from the job (``--hang-timeout auto``: :mod:`unirank.hang.
    #: learned`), and ends the job only for a stuck rank, not a slow one
    learned: bool = False
    #: what a straggler leads to (:data:`ON_SLOW_CHOICES`): ``evict`` only in an elastic job's
    #: attempt whose world may lose a node (:func:`on_slow_now`)
    on_slow: str = "warn"

    def environ(self) -> dict[str, str]:
        """These settings as the worker's variables (what :func:`resolve_hang` reads back)."""
        env = {HANG_REPORT_AFTER_VAR: ("off" if self.report_after is None
                                       else format_seconds(self.report_after)),
               HANG_INTERVAL_VAR: format_seconds(self.interval)}
        if self.timeout is not None:
            env[HANG_TIMEOUT_VAR] = format_seconds(self.timeout)
        else:  # off said, else an elastic job's worker would read its default, auto
            env[HANG_TIMEOUT_VAR] = HANG_TIMEOUT_AUTO if self.learned else "off"
        env[HANG_NAMES_VAR] = ",".join(self.names)  # else the workers would name the variables
        env[ON_SLOW_VAR] = self.on_slow
        return env


def given_as(name: str) -> str:
    """A setting's name as the user gave it: ``--hang-timeout`` (an option), ``hang_timeout=``
    (a keyword), ``UNIRANK_HANG_TIMEOUT`` (a variable)."""
    return name if name.startswith("-") or name.isupper() else f"{name}="


def shown_setting(name: str, seconds: float) -> str:
    """A setting and its value as the user gave them: ``--hang-timeout 6 s``, ``hang_timeout=6``,
    ``UNIRANK_HANG_TIMEOUT=6``."""
    if name.startswith("-"):
        return f"{name} {seconds:g} s"
    return f"{name}={seconds:g}"


def _off_or_seconds(given: str | float | None, environ: Mapping[str, str], variable: str,
                    option: str) -> tuple[float | None, bool]:
    """``given`` (else ``variable``'s value) as seconds; None for ``off``/``0``; and whether
    anything was set at all."""
    name, text = (option, str(given)) if given is not None else (variable,
                                                                  environ.get(variable, ""))
    if isinstance(given, bool) or not text.strip():
        if isinstance(given, bool):
            raise ConfigError("must be a number of seconds", variable=option, value=str(given),
                              hint="give a number of seconds, or off")
        return None, False
    if text.strip().lower() in ("off", "none", "no"):
        return None, True
    return (parse_seconds(text, name, allow_zero=True) or None), True


#: the watchers' interval where the timeout is learned (``auto``) and UNIRANK_HANG_INTERVAL
#: is not set: a stuck rank is seen, and the job ends, within a few of them
LEARNED_INTERVAL = 0.5


def resolve_hang(report_after: str | float | None = None, timeout: str | float | None = None,
                 environ: Mapping[str, str] | None = None, *,
                 names: tuple[str, str] = HANG_OPTIONS, elastic: bool | None = None,
                 on_slow: str | None = None) -> HangSettings:
    """The hang detector's settings: the options given (``--hang-report-after``,
    ``--hang-timeout``, or the keywords ``hang_report_after=``, ``hang_timeout=`` of
    :func:`unirank.init` and ``Parallel``: ``names`` says which, for the errors), else the
    variables, else 60 s and no timeout, but the learned one (``auto``) in an elastic job
    (``elastic``; None: UNIRANK_ELASTIC says); ``0`` or ``off`` turns either one off. The
    interval is UNIRANK_HANG_INTERVAL, else a quarter of the report delay (0.25 to 5 s), else
    :data:`LEARNED_INTERVAL` where the timeout is learned. A bad value is a ConfigError naming
    where it came from.

    ``on_slow``: ``--on-slow``, else UNIRANK_ON_SLOW (:func:`resolve_on_slow`).

    Reads: UNIRANK_HANG_REPORT_AFTER, UNIRANK_HANG_TIMEOUT, UNIRANK_HANG_INTERVAL,
    UNIRANK_ELASTIC, UNIRANK_ON_SLOW.
    """
    environ = environ or {}
    is_elastic = flag(environ, ELASTIC_VAR) if elastic is None else elastic
    after, given = _off_or_seconds(report_after, environ, HANG_REPORT_AFTER_VAR, names[0])
    if not given:
        after = DEFAULT_HANG_REPORT_AFTER
    learned = _asks_auto(timeout, environ)
    limit, set_ = (None, True) if learned else _off_or_seconds(timeout, environ,
                                                               HANG_TIMEOUT_VAR, names[1])
    if not set_:
        learned = is_elastic
    shown = _hang_names(environ, names, report_after is None, timeout is None)
    text = environ.get(HANG_INTERVAL_VAR, "")
    if text.strip():
        interval = parse_seconds(text, HANG_INTERVAL_VAR)
    else:
        interval = min(5.0, max(0.25, (after or DEFAULT_HANG_REPORT_AFTER) / 4))
    if after is None:
        limit, learned = None, False  # no detector: nothing to time out
    elif learned and not text.strip():
        interval = min(interval, LEARNED_INTERVAL)
    elif limit is not None and limit < after:
        after = limit  # the hang must be seen (and reported) by the time it ends the job
        if not text.strip():  # and the job ended soon after: every rank ends within 2 looks
            interval = min(5.0, max(0.25, after / 8))
    slow = resolve_on_slow(on_slow, environ, elastic=is_elastic) if after is not None else "warn"
    return HangSettings(after, limit, interval, shown, learned, slow)


def _asks_auto(given: str | float | None, environ: Mapping[str, str]) -> bool:
    """Whether the timeout given (else UNIRANK_HANG_TIMEOUT) is ``auto``."""
    text = given if given is not None else environ.get(HANG_TIMEOUT_VAR, "")
    return isinstance(text, str) and text.strip().lower() == HANG_TIMEOUT_AUTO


def _hang_names(environ: Mapping[str, str], names: tuple[str, str], after_from_variable: bool,
                timeout_from_variable: bool) -> tuple[str, str]:
    """What the reports call the two settings: UNIRANK_HANG_NAMES (the supervisor's word on how
    they were given), else per setting the variable's name where it was read from a variable
    that is set, else ``names``."""
    carried = environ.get(HANG_NAMES_VAR, "").split(",")
    if len(carried) == 2 and all(carried):
        return carried[0], carried[1]
    after = HANG_REPORT_AFTER_VAR if after_from_variable and \
        environ.get(HANG_REPORT_AFTER_VAR, "").strip() else names[0]
    limit = HANG_TIMEOUT_VAR if timeout_from_variable and \
        environ.get(HANG_TIMEOUT_VAR, "").strip() else names[1]
    return after, limit


def default_max_restarts(given: int | None, *, elastic: bool) -> int:
    """``--max-restarts``: as ``given``, else :data:`ELASTIC_MAX_RESTARTS` for an elastic job
    (a range ``MIN:MAX`` of the dynamic rendezvous), else 0 (torchrun's default)."""
    if given is not None:
        return given
    return ELASTIC_MAX_RESTARTS if elastic else 0


def resolve_on_hang(given: str | None, environ: Mapping[str, str], *, elastic: bool,
                    restarts: int, option: str = "--on-hang") -> str:
    """What ``--hang-timeout`` leads to: ``given`` (``--on-hang``, or the ``on_hang=`` keyword:
    ``option`` names it), else UNIRANK_ON_HANG, else ``evict`` in an elastic job (a range
    ``MIN:MAX`` of the dynamic rendezvous) with restarts left, ``restart`` with restarts left,
    else ``exit``. ``evict`` in a static world is refused (no node can leave it).

    Reads: UNIRANK_ON_HANG.
    """
    source, text = (option, given) if given is not None else (ON_HANG_VAR,
                                                               environ.get(ON_HANG_VAR))
    if text is None or not text.strip():
        return "evict" if elastic and restarts > 0 else "restart" if restarts > 0 else "exit"
    choice = text.strip().lower()
    if choice not in ON_HANG_CHOICES:
        raise ConfigError("is not what unirank does on a hang", variable=source, value=text,
                          hint=f"give one of {', '.join(ON_HANG_CHOICES)}")
    if choice == "evict" and not elastic:
        raise ConfigError("needs an elastic job, whose world may shrink", variable=source,
                          value=text, hint="use --nnodes MIN:MAX with --rdzv-backend c10d, or "
                          "--on-hang restart|exit")
    return choice


def on_hang_now(configured: str, asked: str | None) -> str:
    """What the supervisor does at an attempt's hang timeout: the program's ``on_hang=`` keyword
    (``asked``: what its ranks wrote in the attempt's folder, checked by
    :func:`resolve_on_hang` where it was given) wins over ``--on-hang``/UNIRANK_ON_HANG and
    their default (``configured``); anything else there is ignored."""
    choice = (asked or "").strip().lower()
    return choice if choice in ON_HANG_CHOICES else configured


def resolve_on_slow(given: str | None, environ: Mapping[str, str], *, elastic: bool,
                    option: str = "--on-slow") -> str:
    """What a straggler leads to: ``given`` (``--on-slow``), else UNIRANK_ON_SLOW, else
    ``warn``; ``evict`` in a static world is refused (no node can leave it).

    Reads: UNIRANK_ON_SLOW.
    """
    source, text = (option, given) if given is not None else (ON_SLOW_VAR,
                                                               environ.get(ON_SLOW_VAR))
    if text is None or not text.strip():
        return "warn"
    choice = text.strip().lower()
    if choice not in ON_SLOW_CHOICES:
        raise ConfigError("is not what unirank does with a straggler", variable=source,
                          value=text, hint=f"give one of {', '.join(ON_SLOW_CHOICES)}")
    if choice != "warn" and not elastic:
        raise ConfigError("needs an elastic job, whose world may shrink", variable=source,
                          value=text, hint="use --nnodes MIN:MAX with --rdzv-backend c10d, or "
                          "--on-slow warn")
    return choice


def on_slow_now(configured: str, nodes: int, min_nodes: int) -> str:
    """``--on-slow`` for an attempt of ``nodes`` nodes: ``evict`` only while one node may leave
    without taking the world below its ``min_nodes`` (else the next round would wait for a
    node the job does not have), else ``warn``; ``replace`` always (it acts only where a
    spare waits to take the node's place: the world keeps its size)."""
    if configured == "replace":
        return "replace"
    return "evict" if configured == "evict" and nodes - 1 >= max(min_nodes, 1) else "warn"
