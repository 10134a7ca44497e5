"""The validated options of ``unirank bench`` (pure): bad values are one-line ConfigErrors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from unirank.bench.ops import DTYPES, OP_NAMES
from unirank.bench.sizes import parse_size, sweep
from unirank.errors import ConfigError
from unirank.gpus import COMMAND_BACKENDS

__all__ = ["BACKENDS", "BenchConfig", "choose", "make_config", "whole_number"]

#: the process-group backends ``unirank bench`` measures
BACKENDS = COMMAND_BACKENDS


@dataclass(frozen=True)
class BenchConfig:
    """What every rank runs (picklable: it travels to spawned workers)."""

    ops: tuple[str, ...]
    dtype: str
    min_bytes: int
    max_bytes: int
    step_factor: int
    iters: int
    warmup: int
    progress: bool = False
    json_path: Optional[str] = None
    csv_path: Optional[str] = None
    plot_path: Optional[str] = None
    command: str = "unirank bench"  # the command line, for the header

    @property
    def sizes(self) -> list[int]:
        """The requested sizes in bytes, from ``min_bytes`` to ``max_bytes``."""
        return sweep(self.min_bytes, self.max_bytes, self.step_factor)


def choose(value: str, valid: tuple[str, ...], option: str) -> str:
    """``value`` if it is one of ``valid``, else a ConfigError naming the choices."""
    if value in valid:
        return value
    raise ConfigError("not a valid choice", variable=option, value=value,
                      hint=f"choose one of {', '.join(valid)}")


def whole_number(text: str, option: str, minimum: int) -> int:
    """``text`` as an integer of at least ``minimum``, else a one-line ConfigError."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ConfigError(f"must be a whole number >= {minimum}", variable=option, value=text)
    return value


def make_config(
    *,
    op: str,
    dtype: str,
    min_bytes: str,
    max_bytes: str,
    step_factor: str,
    iters: str,
    warmup: str,
    progress: bool = False,
    json_path: Optional[str] = None,
    csv_path: Optional[str] = None,
    plot_path: Optional[str] = None,
    command: str = "unirank bench",
) -> BenchConfig:
    """A :class:`BenchConfig` from the raw option values; raises ConfigError on bad input."""
    ops = OP_NAMES if choose(op, (*OP_NAMES, "all"), "--op") == "all" else (op,)
    low = parse_size(min_bytes, "--min-bytes")
    high = parse_size(max_bytes, "--max-bytes")
    if low > high:
        raise ConfigError(f"is larger than --max-bytes {max_bytes}", variable="--min-bytes",
                          value=min_bytes, hint="give --min-bytes <= --max-bytes")
    return BenchConfig(
        ops=ops,
        dtype=choose(dtype, tuple(DTYPES), "--dtype"),
        min_bytes=low,
        max_bytes=high,
        step_factor=whole_number(step_factor, "--step-factor", 2),
        iters=whole_number(iters, "--iters", 1),
        warmup=whole_number(warmup, "--warmup", 0),
        progress=progress,
        json_path=json_path,
        csv_path=csv_path,
        plot_path=plot_path,
        command=command,
    )
