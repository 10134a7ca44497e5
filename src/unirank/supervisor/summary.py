"""How the workers ended: exit codes, the tail of each worker's stderr, and the failure summary."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from unirank.joincheck import format_ranks

__all__ = [
    "OutputTail",
    "RunResult",
    "WorkerExit",
    "describe_returncode",
    "exit_code_of",
    "format_summary",
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
    return 128 - returncode if returncode < 0 else returncode


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_returncode(returncode: int) -> str:
    """``exit code 3`` or ``killed by SIGKILL (signal 9)``."""
    if returncode < 0:
        return f"killed by {_signal_name(-returncode)} (signal {-returncode})"
    return f"exit code {returncode}"


@dataclass(frozen=True)
class WorkerExit:
    """One worker's end."""

    rank: int
    local_rank: int
    node: str
    returncode: int
    stderr_tail: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        """True for a non-zero exit or death by a signal."""
        return self.returncode != 0


@dataclass(frozen=True)
class RunResult:
    """What the supervisor saw: every worker's end, the first failure, and any stop signal."""

    exits: tuple[WorkerExit, ...]
    first_failure: WorkerExit | None = None
    stop_signal: int | None = None
    unreaped: tuple[int, ...] = field(default=())

    @property
    def exit_code(self) -> int:
        """The first failure's exit code; 128 + signal when a forwarded SIGINT/SIGTERM stopped a
        worker; else 0."""
        if self.first_failure is not None:
            return exit_code_of(self.first_failure.returncode)
        if self.unreaped:
            return 1
        if self.stop_signal is not None and any(w.failed for w in self.exits):
            return 128 + self.stop_signal
        return 0


def format_summary(result: RunResult, *, prog: str = "unirank run") -> str:
    """The failure report for stderr ("" when every worker succeeded)."""
    if result.exit_code == 0:
        return ""
    out: list[str] = []
    first = result.first_failure
    if first is not None:
        out.append(
            f"{prog}: FAILED (exit code {result.exit_code}): rank {first.rank} "
            f"(local rank {first.local_rank}) on node {first.node}: "
            f"{describe_returncode(first.returncode)}"
        )
        excerpt = traceback_excerpt(list(first.stderr_tail))
        if excerpt:
            out.append(f"  last lines of rank {first.rank}'s stderr:")
            out.extend(f"    | {line}" for line in excerpt)
        else:
            out.append(f"  rank {first.rank} wrote nothing to stderr")
    elif result.stop_signal is not None:
        out.append(
            f"{prog}: stopped by {_signal_name(result.stop_signal)} "
            f"(exit code {result.exit_code}), forwarded to the workers"
        )
    else:
        out.append(f"{prog}: FAILED (exit code {result.exit_code})")
    others = [w for w in result.exits if first is None or w.rank != first.rank]
    if others:
        by_state: dict[str, list[int]] = {}
        for worker in others:
            state = "ok" if not worker.failed else describe_returncode(worker.returncode)
            by_state.setdefault(state, []).append(worker.rank)
        states = "; ".join(f"{format_ranks(ranks)}: {state}" for state, ranks in by_state.items())
        out.append(f"  other workers: {states}")
    if result.unreaped:
        out.append(
            "  still running after SIGKILL (stuck in the kernel?): pids "
            + ", ".join(str(pid) for pid in result.unreaped)
        )
    return "\n".join(out) + "\n"
