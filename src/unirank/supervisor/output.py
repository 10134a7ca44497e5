"""Where worker output goes: line prefixes, log files, console filters (pure; no I/O).

* ``--tag-output``: ``[rank3]:`` before every line, like torchrun's
  ``--log-line-prefix-template '[rank${rank}]:'`` (``${rank}``, ``${local_rank}`` and
  ``${role_name}`` are expanded in a template).
* ``--redirects`` / ``--tee`` (torchrun's values: ``0`` none, ``1`` stdout, ``2`` stderr, ``3``
  both, or per local rank ``0:3,1:1``): the stream goes to
  ``<log_dir>/<run_id>/attempt_<n>/<local_rank>/stdout.log`` (``stderr.log``); redirected
  streams leave the console, teed ones stay on it too.
* ``--local-ranks-filter 0,2``: only those local ranks' output reaches the console (log files and
  the failure summary still get everything).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from string import Template

from unirank.errors import ConfigError

__all__ = ["LinePrefixer", "OutputOptions", "parse_ranks_filter", "parse_std", "tag_for"]

TAG_TEMPLATE = "[rank${rank}]:"
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


@dataclass(frozen=True)
class OutputOptions:
    """Where each local rank's stdout (bit 1) and stderr (bit 2) go."""

    prefix_template: str | None = None
    redirects: int | dict[int, int] = 0
    tee: int | dict[int, int] = 0
    log_dir: str | None = None
    ranks_filter: frozenset[int] | None = None

    @staticmethod
    def _bits(spec: int | dict[int, int], local_rank: int) -> int:
        return spec.get(local_rank, 0) if isinstance(spec, dict) else spec

    def redirected(self, local_rank: int, bit: int) -> bool:
        """True when the stream (1 stdout, 2 stderr) goes to its log file only."""
        return bool(self._bits(self.redirects, local_rank) & bit)

    def shown(self, local_rank: int) -> bool:
        """True when this local rank's output may reach the console."""
        return self.ranks_filter is None or local_rank in self.ranks_filter

    def log_files(self, local_rank: int, folder: str) -> tuple[str | None, str | None]:
        """The stdout and stderr log files of ``local_rank`` (None: no file)."""
        bits = self._bits(self.redirects, local_rank) | self._bits(self.tee, local_rank)
        return (f"{folder}/stdout.log" if bits & 1 else None,
                f"{folder}/stderr.log" if bits & 2 else None)

    @property
    def writes_files(self) -> bool:
        """True when some stream goes to a log file."""
        return any(self._bits(spec, r) for spec in (self.redirects, self.tee)
                   for r in ([*spec] if isinstance(spec, dict) else [0]))

    @property
    def unbuffered(self) -> bool:
        """Whether workers should write unbuffered (tagged or filtered lines as printed)."""
        return self.prefix_template is not None

    def prefix(self, rank: int, local_rank: int, role: str) -> bytes | None:
        """The line prefix of a worker's output, or None."""
        if self.prefix_template is None:
            return None
        text = Template(self.prefix_template).safe_substitute(
            rank=rank, local_rank=local_rank, role_name=role)
        return text.encode()


def tag_for(rank: int) -> bytes:
    """The prefix of rank ``rank``'s lines."""
    return f"[rank{rank}]:".encode()


class LinePrefixer:
    """Turns a byte stream into lines that start with ``prefix``; keeps a partial last line."""

    def __init__(self, prefix: bytes) -> None:
        self._prefix = prefix
        self._partial = b""

    def feed(self, data: bytes) -> bytes:
        """The complete lines in ``self``'s pending bytes plus ``data``, each prefixed."""
        text = self._partial + data
        cut = text.rfind(b"\n")
        if cut < 0:
            self._partial = text
            return b""
        self._partial = text[cut + 1:]
        lines = text[:cut].split(b"\n")
        return b"".join(self._prefix + line + b"\n" for line in lines)

    def flush(self) -> bytes:
        """The pending partial line, prefixed and ended with a newline ("" when none)."""
        if not self._partial:
            return b""
        out = self._prefix + self._partial + b"\n"
        self._partial = b""
        return out
