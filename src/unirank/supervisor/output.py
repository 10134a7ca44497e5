"""Where worker output goes: whole lines, line prefixes, log files, console filters (pure; no
I/O).

* Every worker's stdout and stderr go through its node's supervisor, which passes them on in
  whole lines, each in one write (:class:`LineBuffer`): the lines of workers that share a console
  are never glued together, whatever buffering the workers use (``python -u``,
  ``PYTHONUNBUFFERED=1``). A partial line is passed on once it is :data:`PARTIAL_LINE_DELAY`
  seconds old. Progress bars (``\\r``, ``\\x1b[A``) are read per stream by
  :mod:`~unirank.supervisor.rows` and drawn by :mod:`~unirank.supervisor.console`. When the console
  is a terminal, workers write unbuffered (PYTHONUNBUFFERED=1 unless it is set), so that output
  still shows as it is printed although their stdout is a pipe (``isatty()`` is false in a
  worker, as under srun or mpirun; a program that is not Python block-buffers it, as there).
* ``--tag-output``: ``[rank3]:`` before every line (and bar), like torchrun's
  ``--log-line-prefix-template '[rank${rank}]:'`` (``${rank}``, ``${local_rank}`` and
  ``${role_name}`` are expanded in a template).
* ``--redirects`` / ``--tee`` (torchrun's values: ``0`` none, ``1`` stdout, ``2`` stderr, ``3``
  both, or per local rank ``0:3,1:1``): the stream goes to
  ``<log_dir>/<run_id>_<random>/attempt_<n>/<local_rank>/stdout.log`` (``stderr.log``); redirected
  streams leave the console, teed ones stay on it too.
* ``--local-ranks-filter 0,2``: only those local ranks' output reaches the console (log files and
  the failure summary still get everything).
* ``--duplicate-stdout-filters 'apple,orange'`` (``--duplicate-stderr-filters``), as torchrun:
  the lines of teed streams that hold any of the strings (``,,`` is a comma in one) are copied,
  each after ``[<role><local_rank>]:``, into one file of the attempt for all local ranks,
  ``<run folder>/attempt_<n>/filtered_stdout.log`` (``filtered_stderr.log``)
  (:meth:`OutputOptions.line_copy`, :class:`LineCopy`). Every path: :mod:`unirank.runfolder`.

* torch's C++ stack dumps (the ``Exception raised from ... (most recent call first):`` and
  ``frame #N: ...`` lines torch's c10d warnings carry, the TCPStore's once its node is gone)
  leave the console for the attempt's ``folded.log``: :class:`StackLines` picks them; the
  warning's own line stays.

Runs in the ``unirank run`` parent: the options come from its command line, and
:mod:`.streams` does the I/O. Reads: no environment variable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from string import Template

from unirank.errors import ConfigError
from unirank.runfolder import FILTERED_FILES, AttemptFolder

__all__ = ["FILTERED_FILES", "PARTIAL_LINE_DELAY", "LineBuffer", "LineCopy", "OutputOptions",
           "StackLines", "parse_filters", "parse_ranks_filter", "parse_std"]

#: the attempt folder's files of ``--duplicate-stdout-filters`` / ``--duplicate-stderr-filters``

TAG_TEMPLATE = "[rank${rank}]:"
#: the prefix of a teed line on the console, as torchrun's default
TEE_TEMPLATE = "[${role_name}${local_rank}]:"
#: seconds a partial line (one without its newline yet) is held before it is passed on as it is
PARTIAL_LINE_DELAY = 0.1
#: bytes of a partial line that are passed on at once, however young
PARTIAL_LINE_LIMIT = 65536
_CURSOR_UP = b"\x1b[A"
#: a line of torch's C++ stack dump, after torch's own ``[rankN]:`` where it puts one
_STACK_LINE = re.compile(r"^(\[rank\d+\]:)?(Exception raised from .* \(most recent call "
                         r"first\):|frame #\d+: |<omitting python frames>)")
_STD_VALUE = re.compile(r"^[0-3]$")
_STD_MAPPING = re.compile(r"^[0-9]+:[0-3](,[0-9]+:[0-3])*$")


def parse_std(value: str, option: str) -> int | dict[int, int]:
    """torchrun's ``Std`` syntax: ``0``..``3`` for every local rank, or ``LOCAL_RANK:V,...``."""
    text = value.strip()
    if _STD_VALUE.match(text):
        return int(text)
    if _STD_MAPPING.match(text):
        return {int(k): int(v) for k, v in (item.split(":") for item in text.split(","))}
    raise ConfigError(
        "is not 0 (none), 1 (stdout), 2 (stderr), 3 (both) or a map like 0:3,1:1",
        variable=option, value=value, hint=f"e.g. {option} 3, or {option} 0:3,1:2",
    )


def parse_ranks_filter(value: str) -> frozenset[int]:
    """``--local-ranks-filter``: comma-separated local ranks."""
    try:
        ranks = frozenset(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        ranks = frozenset({-1})
    if not ranks or min(ranks) < 0:
        raise ConfigError("is not a comma-separated list of local ranks",
                          variable="--local-ranks-filter", value=value,
                          hint="e.g. --local-ranks-filter 0 or 0,1")
    return ranks


def parse_filters(value: str) -> tuple[str, ...]:
    """torchrun's ``--duplicate-std*-filters``: comma-separated strings, ``,,`` a comma in one
    (torchrun's ``comma_separated_list``); empty strings match nothing and are dropped."""
    placeholder = "\0"
    items = value.replace(",,", placeholder).split(",")
    return tuple(item.replace(placeholder, ",") for item in items if item)


@dataclass(frozen=True)
class LineCopy:
    """The lines of a stream copied into a file: those that hold any of ``needles``, each
    after ``tag`` (torchrun's ``[default0]:``)."""

    path: str
    needles: tuple[str, ...]
    tag: str

    def picks(self, line: str) -> bool:
        """Whether ``line`` is copied."""
        return any(needle in line for needle in self.needles)


@dataclass(frozen=True)
class OutputOptions:
    """Where each local rank's stdout (bit 1) and stderr (bit 2) go."""

    prefix_template: str | None = None
    #: the prefix of a teed stream's console lines (TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE; None:
    #: torchrun's ``[${role_name}${local_rank}]:``)
    tee_prefix_template: str | None = None
    redirects: int | dict[int, int] = 0
    tee: int | dict[int, int] = 0
    log_dir: str | None = None
    ranks_filter: frozenset[int] | None = None
    #: the supervisor's stdout is a terminal
    console_tty: bool = False
    #: ``--duplicate-stdout-filters``, ``--duplicate-stderr-filters``
    stdout_filters: tuple[str, ...] = ()
    stderr_filters: tuple[str, ...] = ()

    @staticmethod
    def _bits(spec: int | dict[int, int], local_rank: int) -> int:
        return spec.get(local_rank, 0) if isinstance(spec, dict) else spec

    def redirected(self, local_rank: int, bit: int) -> bool:
        """True when the stream (1 stdout, 2 stderr) goes to its log file only (a teed one
        stays on the console too: tee wins, as torchrun)."""
        return bool(self._bits(self.redirects, local_rank) & bit
                    and not self._bits(self.tee, local_rank) & bit)

    def teed(self, local_rank: int, bit: int) -> bool:
        """True when the stream (1 stdout, 2 stderr) is teed: its file and the console."""
        return bool(self._bits(self.tee, local_rank) & bit)

    def shown(self, local_rank: int) -> bool:
        """True when this local rank's output may reach the console."""
        return self.ranks_filter is None or local_rank in self.ranks_filter

    def log_files(self, local_rank: int,
                  attempt: AttemptFolder) -> tuple[str | None, str | None]:
        """The stdout and stderr log files of ``local_rank`` (None: no file)."""
        bits = self._bits(self.redirects, local_rank) | self._bits(self.tee, local_rank)
        return (attempt.log_file(local_rank, 1) if bits & 1 else None,
                attempt.log_file(local_rank, 2) if bits & 2 else None)

    def line_copy(self, local_rank: int, bit: int, attempt: AttemptFolder,
                  role: str) -> LineCopy | None:
        """Where the filtered lines of ``local_rank``'s stream (1 stdout, 2 stderr) are copied,
        as torchrun: only a teed stream's, with filters given; else None."""
        needles = self.stdout_filters if bit == 1 else self.stderr_filters
        if not needles or not self._bits(self.tee, local_rank) & bit:
            return None
        return LineCopy(attempt.filtered_file(bit), needles,
                        f"[{role}{local_rank}]:")

    @property
    def writes_files(self) -> bool:
        """True when some stream goes to a log file."""
        return any(self._bits(spec, r) for spec in (self.redirects, self.tee)
                   for r in ([*spec] if isinstance(spec, dict) else [0]))

    @property
    def unbuffered(self) -> bool:
        """Whether workers should write unbuffered: their output is tagged, or shown on a
        terminal, where it comes out as it is printed (a pipe would make Python buffer it)."""
        return self.prefix_template is not None or self.console_tty

    def prefix(self, rank: int, local_rank: int, role: str) -> bytes | None:
        """The line prefix of a worker's output, or None."""
        if self.prefix_template is None:
            return None
        text = Template(self.prefix_template).safe_substitute(
            rank=rank, local_rank=local_rank, role_name=role)
        return text.encode()

    def tee_prefix(self, rank: int, local_rank: int, role: str) -> bytes | None:
        """The prefix of a teed stream's console lines, as torchrun's: ``[default0]:``, or
        TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE's expansion; None without a teed stream or with
        ``--tag-output`` (its prefix is on every line already)."""
        if self.prefix_template is not None or not self._bits(self.tee, local_rank):
            return None
        template = self.tee_prefix_template or TEE_TEMPLATE
        text = Template(template).safe_substitute(rank=rank, local_rank=local_rank,
                                                  role_name=role)
        return text.encode()


class StackLines:
    """Picks the lines of torch's C++ stack dumps in one stream: their ``Exception raised
    from`` and ``frame #N`` lines and the empty line that ends a dump."""

    def __init__(self) -> None:
        self._inside = False

    def picks(self, line: str) -> bool:
        """Whether ``line`` (the stream's next) belongs to a C++ stack dump."""
        if _STACK_LINE.match(line):
            self._inside = True
            return True
        inside, self._inside = self._inside, False
        return inside and not line.strip()


class LineBuffer:
    """One worker stream cut where a terminal would act: what :meth:`feed` gets up to its last
    line end (``\\n``, the ``\\r`` with which a progress bar redraws itself, or the
    ``\\x1b[A`` with which it moves up) passes on at once, in one piece; the rest, a partial
    line, waits for its end, but never longer than :data:`PARTIAL_LINE_DELAY` seconds after its
    first byte came (nor past :data:`PARTIAL_LINE_LIMIT` bytes): then :meth:`flush_partial`
    passes it on. An unbuffered ``print`` writes its text and its newline apart, a few
    microseconds apart: held together, they reach the console as one line.
    :class:`~unirank.supervisor.rows.RankRows` then reads what is passed on.
    """

    def __init__(self) -> None:
        self._partial = b""
        #: when (a ``time.monotonic()`` value) the partial line's first byte came, or None
        self.held_since: float | None = None

    @property
    def deadline(self) -> float | None:
        """When the partial line is due to be passed on as it is (None: nothing held)."""
        return None if self.held_since is None else self.held_since + PARTIAL_LINE_DELAY

    def feed(self, data: bytes, now: float = 0.0) -> bytes:
        """The whole lines (and ``\\r`` updates) in the pending bytes plus ``data``."""
        text = self._partial + data
        up = text.rfind(_CURSOR_UP)
        cut = max(text.rfind(b"\n"), text.rfind(b"\r"),
                  up + len(_CURSOR_UP) - 1 if up >= 0 else -1)
        if cut < 0:
            self._partial = text
            if text and self.held_since is None:
                self.held_since = now
            return self.flush_partial() if len(text) >= PARTIAL_LINE_LIMIT else b""
        self._partial = text[cut + 1:]
        self.held_since = now if self._partial else None
        return text[:cut + 1]

    def flush_partial(self) -> bytes:
        """The partial line as it is, or b"" when none is held."""
        chunk, self._partial, self.held_since = self._partial, b"", None
        return chunk
