"""How the workers ended: exit codes, the tail of each worker's stderr, why a worker died (the
OOM killer, a fatal signal's Python stack: :mod:`.deathcause`), and the failure summary."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from unirank.exitcodes import REQUEUE as REQUEUE_EXIT_CODE
from unirank.exitcodes import killed_by
from unirank.hang.render import uneven_ended
from unirank.joincheck import format_ranks
from unirank.supervisor.deathcause import FAULT_HEAD, OomVerdict
from unirank.words import counted

__all__ = [
    "OutputTail",
    "RunResult",
    "WorkerExit",
    "describe_end",
    "describe_returncode",
    "ended",
    "exit_code_of",
    "format_bytes",
    "format_summary",
    "signal_name",
    "traceback_excerpt",
]

#: how much of each worker's stderr is kept for the summary
TAIL_BYTES = 64 * 1024
#: how many lines of a traceback the summary shows
EXCERPT_LINES = 15
_TRACEBACK_HEAD = "Traceback (most recent call last):"


class OutputTail:
    """The last ``limit`` bytes written to a stream, for the failure summary."""

    def __init__(self, limit: int = TAIL_BYTES) -> None:
        self._limit = limit
        self._data = bytearray()
        self._dropped = False

    def feed(self, data: bytes) -> None:
        """Keep ``data``, dropping the oldest bytes beyond the limit."""
        self._data += data
        excess = len(self._data) - self._limit
        if excess > 0:
            del self._data[:excess]
            self._dropped = True

    def lines(self) -> list[str]:
        """The kept text as lines (a first line cut by the limit is left out)."""
        lines = self._data.decode("utf-8", errors="replace").splitlines()
        if self._dropped and lines:
            lines = lines[1:]
        return lines


def traceback_excerpt(lines: list[str], max_lines: int = EXCERPT_LINES) -> list[str]:
    """The last Python traceback in ``lines`` (through to the end), else the last lines.

    At most ``max_lines`` lines: a long traceback keeps its first line and its end.
    """
    start = None
    for index in range(len(lines) - 1, -1, -1):
        if _TRACEBACK_HEAD in lines[index]:
            start = index
            break
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    if start is None or start >= len(lines):
        return lines[-max_lines:]
    excerpt = lines[start:]
    if len(excerpt) > max_lines:
        excerpt = [excerpt[0], "  ...", *excerpt[-(max_lines - 2):]]
    return excerpt


def exit_code_of(returncode: int) -> int:
    """A worker's status as a shell exit code: the code itself, or 128 + signal number."""
    return killed_by(-returncode) if returncode < 0 else returncode


def signal_name(signum: int) -> str:
    """``SIGTERM``, or ``signal 99`` for a number that names no signal."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_returncode(returncode: int) -> str:
    """``exit code 3`` or ``killed by SIGKILL (signal 9)``."""
    if returncode < 0:
        return f"killed by {signal_name(-returncode)} (signal {-returncode})"
    return f"exit code {returncode}"


def format_bytes(size: int) -> str:
    """``198 MiB``, ``12.5 GiB``."""
    if size >= 10 << 30:
        return f"{size / (1 << 30):.1f} GiB"
    return f"{size / (1 << 20):.0f} MiB"


def _oom_text(oom: OomVerdict) -> str:
    """Where the OOM killer struck: the limit that applied, or the whole machine."""
    if oom.limit is not None:
        return f"cgroup {oom.limit_cgroup}, {oom.limit_file} {format_bytes(oom.limit)}"
    if oom.cgroup is not None:
        return f"cgroup {oom.cgroup}, no memory limit: the machine ran out of memory"
    return f"{oom.evidence} names its pid"


def describe_end(returncode: int, oom: OomVerdict | None = None,
                 peak_memory: int | None = None) -> str:
    """How a worker ended: :func:`describe_returncode`, a SIGKILL named as the kernel's OOM
    killer's (or as not, where ``oom`` could tell), with its peak memory (bytes)."""
    if oom is not None and oom.killed:
        text = f"killed by the kernel's OOM killer (SIGKILL, signal 9; {_oom_text(oom)})"
    else:
        text = describe_returncode(returncode)
        if oom is not None:
            text += f", not by the OOM killer ({oom.evidence} shows no OOM kill of it)"
    if peak_memory is not None and returncode == -int(signal.SIGKILL):
        text += f"; peak memory {format_bytes(peak_memory)}"
    return text


def ended(how: str) -> str:
    """``how`` a worker ended (:func:`describe_end`) after "rank 1 on node x ...": "ended with
    exit code 1", "was killed by SIGSEGV (signal 11)"."""
    return f"was {how}" if how.startswith("killed") else f"ended with {how}"


@dataclass(frozen=True)
class WorkerExit:
    """One worker's end."""

    rank: int
    local_rank: int
    node: str
    returncode: int
    stderr_tail: tuple[str, ...] = ()
    #: the last line of the error it recorded (TORCHELASTIC_ERROR_FILE), if any
    error: str = ""
    #: True when the supervisor signalled it to stop (its end was then the teardown's doing)
    stopped: bool = False
    #: the exit code its recorded error means (1, or a SystemExit's code)
    recorded_exit_code: int | None = None
    #: its recorded error is a ConfigError: a one-line launch or usage mistake
    config_error: bool = False
    #: its recorded error says a peer went away (:attr:`unirank.errorfile.RecordedFailure.
    #: lost_peer`, read once from the whole message): the failure of another rank, seen here
    lost_peer: bool = False
    #: its peak resident memory in bytes (``ru_maxrss`` where it was reaped), if known
    peak_memory: int | None = None
    #: whether the kernel's OOM killer killed it (a SIGKILL the supervisor did not send)
    oom: OomVerdict | None = None
    #: the Python stack faulthandler wrote at its fatal signal (SIGSEGV, SIGABRT, ...)
    fault_stack: tuple[str, ...] = ()
    #: the file that holds its stderr where the console did not show it (``--redirects``)
    stderr_file: str | None = None

    @property
    def failed(self) -> bool:
        """True for a non-zero exit or death by a signal."""
        return self.returncode != 0

    @property
    def requeued(self) -> bool:
        """True when it exited with REQUEUE_EXIT_CODE (79): it stopped to run again later."""
        return self.returncode == REQUEUE_EXIT_CODE

    @property
    def own_exit_code(self) -> int:
        """The exit code of this worker's own failure: its status, unless the supervisor
        stopped it while it was failing (then what its recorded error means)."""
        if self.stopped and self.recorded_exit_code is not None:
            return self.recorded_exit_code
        return exit_code_of(self.returncode)

    def describe(self) -> str:
        """How it ended, as the summary says it."""
        if self.stopped and self.recorded_exit_code is not None:
            return (f"failed (exit code {self.recorded_exit_code}), then was stopped by the "
                    "teardown while exiting")
        return describe_end(self.returncode, self.oom, self.peak_memory)

    @property
    def state(self) -> str:
        """How it ended, in a few words (the summary's line of other workers)."""
        if self.oom is not None and self.oom.killed:
            return "killed by the kernel's OOM killer"
        return describe_returncode(self.returncode)


@dataclass(frozen=True)
class RunResult:
    """What the supervisor saw: every worker's end, the first failure, and any stop signal."""

    exits: tuple[WorkerExit, ...]
    first_failure: WorkerExit | None = None
    stop_signal: int | None = None
    unreaped: tuple[int, ...] = field(default=())
    #: the results of earlier attempts that failed (``--max-restarts``)
    attempts: tuple[RunResult, ...] = field(default=())
    #: why the supervisor stopped the workers when the world changed (a node of the dynamic
    #: rendezvous lost, or one waiting to join), as the rendezvous said it, and its kind
    #: (:mod:`unirank.supervisor.rdzv.messages`)
    world_changed: str | None = None
    world_change_kind: str | None = None
    #: the line naming the workers stuck in D state past the timeout, who ended the run
    #: (:mod:`unirank.supervisor.dstate`)
    stuck: str | None = None
    #: an earlier attempt's: how the job's nodes changed after it (``node lost: node2``,
    #: ``node evicted: rank 1 never entered all_reduce #12``, ``store moved to node ...``:
    #: :meth:`unirank.elasticstate.RestartReason.headline`), said first in its summary line
    nodes_changed: str | None = None

    @property
    def requeued(self) -> bool:
        """True when no worker failed and at least one stopped to be requeued (exit code 79,
        the others 0 or 79), also after a forwarded SIGINT/SIGTERM."""
        return (self.first_failure is None and not self.unreaped
                and any(w.requeued for w in self.exits)
                and all(w.requeued or w.returncode == 0 for w in self.exits))

    @property
    def exit_code(self) -> int:
        """The root cause's exit code; 79 when the workers stopped to be requeued
        (:attr:`requeued`); 128 + signal when a forwarded SIGINT/SIGTERM stopped the run, also
        when the workers saved and ended 0 (the run was stopped, not finished: a Kubernetes Job
        must not count the pod as done, and torchrun exits non-zero too); else 0."""
        if self.first_failure is not None:
            return self.first_failure.own_exit_code
        if self.stuck is not None:
            return 1
        if self.unreaped or (self.world_changed and any(w.failed for w in self.exits)):
            return 1
        if self.requeued:
            return REQUEUE_EXIT_CODE
        if self.stop_signal is not None:
            return killed_by(self.stop_signal)
        return 0


def _attempt_line(index: int, result: RunResult) -> str:
    """An earlier attempt's line: how the job's nodes changed after it, where they did, then
    its root cause (or the change of the world that stopped it)."""
    first = result.first_failure
    if first is None and result.world_changed:
        end = result.world_changed
    elif first is None:
        end = f"exit code {result.exit_code}"
    else:
        error = f": {first.error}" if first.error else ""
        end = (f"rank {first.rank} (local rank {first.local_rank}) on node {first.node}: "
               f"{first.describe()}{error}")
    head = result.nodes_changed
    if head and end != head:
        return f"  attempt {index}: {head} ({end})"
    return f"  attempt {index}: {end}"


def _requeued_line(result: RunResult, prog: str) -> str:
    stopped = [w.rank for w in result.exits if w.requeued]
    return (f"{prog}: stopped to be requeued (exit code {REQUEUE_EXIT_CODE}): "
            f"{format_ranks(stopped)} saved and stopped so that the run goes on later; "
            "not a failure\n")


def _before_fault(first: WorkerExit) -> list[str]:
    """The root cause's stderr tail, up to a faulthandler dump when its stack is shown apart."""
    lines = list(first.stderr_tail)
    if first.fault_stack:
        starts = [i for i, line in enumerate(lines) if line.startswith(FAULT_HEAD)]
        if starts:
            lines = lines[:starts[-1]]
    return lines


def _others_line(others: list[WorkerExit], first: WorkerExit | None) -> str:
    """``  other workers: rank 0: ok; ranks 2-3: killed by SIGTERM (signal 15), stopped by
    the teardown`` (``  workers: ...`` where no worker failed first: a forwarded stop, a
    world change); a rank that ended 0 after fewer collectives than the root cause called
    (its error's :func:`~unirank.hang.render.uneven_line`) is not called ok."""
    fewer = uneven_ended(first.error) if first is not None else {}
    by_state: dict[str, list[int]] = {}
    for worker in others:
        state = "ok" if not worker.failed else worker.state
        if worker.failed and worker.stopped:
            state += ", stopped by the teardown"
        if not worker.failed and first is not None and worker.rank in fewer:
            state = (f"ended 0 after collective #{fewer[worker.rank]}, fewer than "
                     f"rank {first.rank}")
        by_state.setdefault(state, []).append(worker.rank)
    states = "; ".join(f"{format_ranks(ranks)}: {state}" for state, ranks in by_state.items())
    return f"  {'workers' if first is None else 'other workers'}: {states}"


def format_summary(result: RunResult, *, prog: str = "unirank run") -> str:
    """The failure report for stderr ("" when every worker succeeded; one line, no
    traceback, when they stopped to be requeued); after restarts, a line naming each earlier
    attempt's root cause."""
    if result.requeued:
        return _requeued_line(result, prog)
    if result.exit_code == 0:
        if not result.attempts:
            return ""
        lines = [f"{prog}: succeeded after {counted(len(result.attempts), 'restart')}"]
        lines += [_attempt_line(i, r) for i, r in enumerate(result.attempts)]
        return "\n".join(lines) + "\n"
    out: list[str] = []
    first = result.first_failure
    if first is not None:
        out.append(
            f"{prog}: FAILED (exit code {result.exit_code}): rank {first.rank} "
            f"(local rank {first.local_rank}) on node {first.node}: {first.describe()}"
        )
        excerpt = traceback_excerpt(_before_fault(first))
        if first.error:  # even where the excerpt ends with it: the line to read first
            out.append(f"  error: {first.error}")
        if excerpt:
            where = f" ({first.stderr_file})" if first.stderr_file else ""
            out.append(f"  last lines of rank {first.rank}'s stderr{where}:")
            out.extend(f"    | {line}" for line in excerpt)
        elif not first.fault_stack:
            out.append(f"  rank {first.rank} wrote nothing to stderr")
        if first.fault_stack:
            out.append(f"  Python stack of rank {first.rank} at the fault (faulthandler):")
            out.extend(f"    | {line}" for line in first.fault_stack)
    elif result.stop_signal is not None:
        out.append(
            f"{prog}: stopped by {signal_name(result.stop_signal)} "
            f"(exit code {result.exit_code}), forwarded to the workers"
        )
    elif result.world_changed or result.stuck:
        out.append(f"{prog}: FAILED (exit code {result.exit_code}): "
                   f"{result.world_changed or result.stuck}")
    else:
        out.append(f"{prog}: FAILED (exit code {result.exit_code})")
    others = [w for w in result.exits if first is None or w.rank != first.rank]
    if others:
        out.append(_others_line(others, first))
    if result.attempts:
        out.append(f"  earlier attempts ({counted(len(result.attempts), 'restart')}):")
        out.extend(_attempt_line(i, r) for i, r in enumerate(result.attempts))
    if result.unreaped:
        out.append(
            "  still running after SIGKILL (stuck in the kernel?): pids "
            + ", ".join(str(pid) for pid in result.unreaped)
        )
    return "\n".join(out) + "\n"
