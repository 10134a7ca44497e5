"""The results as nccl-tests prints them, and as CSV and JSON (pure).

The text has nccl-tests' shape: ``#`` header lines (version, the options line, the devices), per
collective a column header, one line per size (``size (B)``, ``count (elements)``, ``type``,
``redop``, ``root``, ``time (us)``, ``algbw (GB/s)``, ``busbw (GB/s)``, ``#wrong``, in nccl-tests'
widths and number format), then two columns of unirank's own (``median`` per-call time in us and
``memcpy``: one process copying the same bytes, GB/s), and the footer lines ``# Out of bounds
values`` and ``# Avg bus bandwidth``. Lines not starting with ``#`` are the data rows.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "CSV_FIELDS",
    "Device",
    "Header",
    "Row",
    "average_busbw",
    "fit",
    "render_csv",
    "render_json",
    "render_text",
    "row_line",
    "section_footer",
    "section_header",
    "text_preamble",
    "text_trailer",
]


@dataclass(frozen=True)
class Device:
    """One rank's line under ``# Using devices``."""

    rank: int
    pid: int
    hostname: str
    device: str  # "cpu", "cuda:0"
    bus: str  # PCI address of a GPU, "-" on CPU
    name: str  # "NVIDIA H100 80GB HBM3", "CPU x86_64"


@dataclass(frozen=True)
class Header:
    """What the preamble says: versions, backend, world, the options, the devices."""

    version: str
    torch_version: str
    backend: str
    world_size: int
    command: str
    dtype: str
    min_bytes: int
    max_bytes: int
    step_factor: int
    warmup: int
    iters: int
    devices: tuple[Device, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Row:
    """One size of one collective: nccl-tests' columns, then median and memcpy."""

    op: str
    size: int  # bytes (the size column)
    count: int  # elements (the count column)
    type: str
    redop: str
    root: int
    time_us: float  # mean per call, max over ranks
    algbw: float  # GB/s
    busbw: float  # GB/s
    wrong: int  # wrong elements, summed over ranks
    median_us: float  # median per call, max over ranks
    memcpy_gbps: float  # one process copying `size` bytes


def fit(value: float, width: int) -> str:
    """``value`` right-aligned in ``width`` characters with as many of 2, 1, 0 decimals as fit,
    else in exponent notation (nccl-tests' number format)."""
    for decimals in (2, 1, 0):
        text = f"{value:{width}.{decimals}f}"
        if len(text) <= width:
            return text
    return f"{value:{width}.{1 if width >= 7 else 0}e}"


#: (name, unit, width) of each column after the first five
_NUMBERS = (("time", "(us)", 7), ("algbw", "(GB/s)", 6), ("busbw", "(GB/s)", 6),
            ("#wrong", "", 6), ("median", "(us)", 7), ("memcpy", "(GB/s)", 6))
_LEAD = "# %10s  %12s  %8s  %6s  %6s"


def _header_line(cells: Sequence[str]) -> str:
    numbers = "".join(f"  {cell:>{width}}" for cell, (_, _, width) in zip(cells[5:], _NUMBERS))
    return (_LEAD % tuple(cells[:5])) + numbers


def text_preamble(header: Header) -> list[str]:
    """The lines before the first table: version, options, devices."""
    lines = [
        f"# unirank bench version {header.version} torch {header.torch_version} "
        f"backend {header.backend} nranks {header.world_size}",
        f"# Collective test starting: {header.command}",
        f"# nThread 1 nGpus 1 minBytes {header.min_bytes} maxBytes {header.max_bytes} "
        f"step: {header.step_factor}(factor) warmup iters: {header.warmup} "
        f"iters: {header.iters} agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    lines += [
        f"#  Rank {d.rank:2d} Group  0 Pid {d.pid:6d} on {d.hostname:>10} device {d.device:>6} "
        f"[{d.bus}] {d.name}"
        for d in header.devices
    ]
    return lines


def section_header(op: str) -> list[str]:
    """The lines that open one collective's table."""
    group = f"{'mean per call, max over ranks':^31}  {'':>7}  {'1 rank':>6}"
    return [
        "#",
        f"# Collective: {op}",
        "#",
        (_LEAD % ("", "", "", "", "")) + "  " + group,
        _header_line(["size", "count", "type", "redop", "root", *(n for n, _, _ in _NUMBERS)]),
        _header_line(["(B)", "(elements)", "", "", "", *(u for _, u, _ in _NUMBERS)]),
    ]


def row_line(row: Row) -> str:
    """One data line, in nccl-tests' widths."""
    return (
        f"{row.size:12d}  {row.count:12d}  {row.type:>8}  {row.redop:>6}  {row.root:6d}"
        f"  {fit(row.time_us, 7)}  {fit(row.algbw, 6)}  {fit(row.busbw, 6)}"
        f"  {float(row.wrong):6g}  {fit(row.median_us, 7)}  {fit(row.memcpy_gbps, 6)}"
    )


def average_busbw(rows: Sequence[Row]) -> float:
    """The mean busbw of ``rows`` (nccl-tests' ``Avg bus bandwidth``), 0 for none."""
    return sum(r.busbw for r in rows) / len(rows) if rows else 0.0


def section_footer(rows: Sequence[Row]) -> list[str]:
    """The lines after one collective's rows: wrong elements and the average busbw."""
    wrong = sum(r.wrong for r in rows)
    return [
        f"# {'Out of bounds values':<20} : {wrong} {'FAILED' if wrong else 'OK'}",
        f"# {'Avg bus bandwidth':<20} : {average_busbw(rows):g}",
    ]


def text_trailer(header: Header) -> list[str]:
    """The closing lines."""
    return ["#", f"# Collective test concluded: {header.command}"]


def _ops_in_order(rows: Sequence[Row]) -> list[str]:
    return list(dict.fromkeys(r.op for r in rows))


def render_text(header: Header, rows: Sequence[Row]) -> str:
    """The whole report as ``unirank bench`` prints it on stdout."""
    lines = text_preamble(header)
    for op in _ops_in_order(rows):
        mine = [r for r in rows if r.op == op]
        lines += section_header(op) + [row_line(r) for r in mine] + section_footer(mine)
    return "\n".join(lines + text_trailer(header)) + "\n"


#: the CSV columns, in order (one line per collective and size)
CSV_FIELDS = ("op", "size", "count", "type", "redop", "root", "time_us", "algbw", "busbw",
              "wrong", "median_us", "memcpy_gbps")


def render_csv(rows: Sequence[Row]) -> str:
    """The rows as CSV with a header line (bandwidths in GB/s, times in us)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for row in rows:
        values = asdict(row)
        writer.writerow([values[name] for name in CSV_FIELDS])
    return out.getvalue()


def render_json(header: Header, rows: Sequence[Row]) -> str:
    """The header, the rows, and per collective the average busbw and the wrong elements."""
    document: dict[str, Any] = {
        "tool": "unirank bench",
        **{k: v for k, v in asdict(header).items() if k != "devices"},
        "devices": [asdict(d) for d in header.devices],
        "results": [asdict(r) for r in rows],
        "average_bus_bandwidth": {
            op: average_busbw([r for r in rows if r.op == op]) for op in _ops_in_order(rows)
        },
        "out_of_bounds": sum(r.wrong for r in rows),
    }
    return json.dumps(document, indent=2) + "\n"
