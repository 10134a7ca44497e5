"""What every rank of ``unirank bench`` runs (imports torch; the CLI loads it lazily).

For each collective and size: every rank measures (:func:`unirank.bench.loop.measure`), rank 0
also times one process's memory copy of the same bytes, then the ranks agree on the row: the
mean and median per-call times are the MAX over ranks (the slowest rank sets the pace), #wrong
is the SUM. Only rank 0 prints (stdout: the table, streamed line by line; stderr: the progress
bar) and writes the ``--json``/``--csv``/``--plot`` files.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Iterator

import torch
import torch.distributed as dist

import unirank
from unirank.bench import loop, report
from unirank.bench.config import BenchConfig
from unirank.bench.ops import DTYPES, OPS, algbw, busbw, layout
from unirank.bench.progress import Progress
from unirank.bench.report import Device, Header, Row
from unirank.bench.sizes import human_size
from unirank.errors import ConfigError

__all__ = ["measure_row", "run_bench"]


def _device_line(device: torch.device) -> Device:
    """This rank's entry under ``# Using devices``."""
    bus, name = "-", f"CPU {platform.machine()}"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name = props.name
        bus = "{:04x}:{:02x}:{:02x}".format(*(getattr(props, f"pci_{part}_id", 0)
                                               for part in ("domain", "bus", "device")))
    return Device(rank=dist.get_rank(), pid=os.getpid(), hostname=unirank.hostname(),
                  device=str(device), bus=bus, name=name)


def _header(config: BenchConfig, device: torch.device) -> Header:
    """The preamble's facts; every rank sends its device line to every rank."""
    devices: list[Device | None] = [None] * dist.get_world_size()
    dist.all_gather_object(devices, _device_line(device))
    return Header(
        version=unirank.__version__, torch_version=torch.__version__,
        backend=str(unirank.backend()), world_size=dist.get_world_size(),
        command=config.command, dtype=config.dtype, min_bytes=config.min_bytes,
        max_bytes=config.max_bytes, step_factor=config.step_factor, warmup=config.warmup,
        iters=config.iters, devices=tuple(d for d in devices if d is not None),
    )


class _Out:
    """Rank 0's stdout lines; on a terminal, the progress bar is erased before each."""

    def __init__(self, enabled: bool, progress: Progress) -> None:
        self.enabled = enabled
        self.progress = progress
        self.shared = sys.stdout.isatty()  # the bar and the table share one screen

    def lines(self, lines: list[str]) -> None:
        """Print ``lines`` (rank 0 only)."""
        if self.enabled:
            if self.shared:
                self.progress.hide()
            sys.stdout.write("".join(f"{line}\n" for line in lines))
            sys.stdout.flush()


def measure_row(name: str, size: int, config: BenchConfig, device: torch.device,
                copies: dict[int, float] | None = None) -> Row:
    """One row, agreed on by every rank: ``name`` at ``size`` requested bytes. Rank 0 also
    times its memory copy of the same bytes, once per size, cached in ``copies`` (no copy
    when ``copies`` is None)."""
    op, kind, n = OPS[name], DTYPES[config.dtype], dist.get_world_size()
    lay = layout(op, size, kind.itemsize, n)
    got = loop.measure(name, lay, getattr(torch, config.dtype), device, config.iters,
                       config.warmup)
    if copies is not None and dist.get_rank() == 0 and lay.nbytes not in copies:
        copies[lay.nbytes] = loop.copy_seconds(lay.nbytes, device, config.iters, config.warmup)
    times = torch.tensor([got.mean_s, got.median_s], dtype=torch.float64, device=device)
    wrong = torch.tensor([got.wrong], dtype=torch.int64, device=device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    dist.all_reduce(wrong)
    mean, median = (float(t) for t in times.tolist())
    return Row(op=name, size=lay.nbytes, count=lay.count, type=kind.nccl_name, redop=op.redop,
               root=op.root, time_us=mean * 1e6, algbw=algbw(lay.nbytes, mean),
               busbw=busbw(op, lay.nbytes, mean, n), wrong=int(wrong.item()),
               median_us=median * 1e6,
               memcpy_gbps=algbw(lay.nbytes, (copies or {}).get(lay.nbytes, 0.0)))


def _rows(config: BenchConfig, device: torch.device, out: _Out) -> Iterator[Row]:
    """Measure every collective and size, printing each row as it is agreed on."""
    copies: dict[int, float] = {}
    for name in config.ops:
        mine = []
        out.lines(report.section_header(name))
        for size in config.sizes:
            out.progress.show(f"{name} {human_size(size)}")
            row = measure_row(name, size, config, device, copies)
            out.progress.step()
            out.lines([report.row_line(row)])
            mine.append(row)
            yield row
        out.lines(report.section_footer(mine))


def _write_files(config: BenchConfig, header: Header, rows: list[Row]) -> None:
    """Rank 0's ``--json``, ``--csv`` and ``--plot`` files."""
    if config.json_path:
        with open(config.json_path, "w") as fh:
            fh.write(report.render_json(header, rows))
    if config.csv_path:
        with open(config.csv_path, "w") as fh:
            fh.write(report.render_csv(rows))
    if config.plot_path:
        from unirank.bench.plot import write_png

        write_png(config.plot_path, header, rows)


def run_bench(local_rank: int, config: BenchConfig) -> None:
    """Benchmark ``config``'s collectives on the running process group; rank 0 reports.

    Raises ConfigError when the group is not a torch.distributed one (gloo or nccl), and
    SystemExit(1) on every rank when a result was wrong.
    Reads: SLURMD_NODENAME (the node's name in the devices lines), CUDA_VISIBLE_DEVICES
    (through torch).
    """
    if not dist.is_available() or not dist.is_initialized():
        raise ConfigError(f"unirank bench measures torch.distributed groups, not "
                          f"{unirank.backend()!r}", variable="--backend",
                          value=str(unirank.backend()), hint="pass --backend gloo or nccl")
    device = unirank.device()
    rank = dist.get_rank()
    header = _header(config, device)
    progress = Progress(sys.stderr, len(config.ops) * len(config.sizes),
                        enabled=config.progress and rank == 0)
    out = _Out(rank == 0, progress)
    out.lines(report.text_preamble(header))
    rows = list(_rows(config, device, out))
    out.lines(report.text_trailer(header))
    progress.close()
    wrong = sum(r.wrong for r in rows)
    if rank == 0:
        _write_files(config, header, rows)
        if wrong:
            print(f"unirank bench: {wrong} wrong elements: the collectives returned wrong data",
                  file=sys.stderr)
    if wrong:
        raise SystemExit(1)
