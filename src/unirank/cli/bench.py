"""``unirank bench``: collective bandwidth, printed as nccl-tests prints it.

Runs in whatever launcher context it was started in (srun, mpirun, torchrun, ``unirank run``), or
spawns ``-n N`` local ranks through the same path as ``unirank hello``. Rank 0 prints the table
on stdout and a progress bar on stderr (when stderr is a terminal, or with ``--progress on``).
No torch at import.
"""

from __future__ import annotations

import argparse
import functools
import shlex
import sys

from unirank.bench.config import BACKENDS, BenchConfig, choose, make_config
from unirank.bench.ops import DTYPES, OP_NAMES
from unirank.cli.hello import add_launch_arguments, launch
from unirank.exitcodes import USAGE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``unirank bench`` (and ``-n``, ``--init-timeout`` as ``unirank hello``)."""
    add_launch_arguments(parser)
    for action in parser._actions:  # the shared --backend, narrowed to the groups bench measures
        if action.dest == "backend":
            action.help = f"process group to measure: {', '.join(BACKENDS)} (default: auto)"
    parser.add_argument("--op", default="all_reduce", metavar="OP",
                        help=f"{', '.join(OP_NAMES)} or all (default: all_reduce)")
    parser.add_argument("--min-bytes", default="4K", metavar="SIZE",
                        help="smallest message: bytes, or with K, M, G (binary; default: 4K)")
    parser.add_argument("--max-bytes", default="256M", metavar="SIZE",
                        help="largest message (default: 256M)")
    parser.add_argument("--step-factor", default="2", metavar="F",
                        help="multiply the size by F at each step (default: 2)")
    parser.add_argument("--dtype", default="float32", metavar="DTYPE",
                        help=f"{', '.join(DTYPES)} (default: float32)")
    parser.add_argument("--iters", default="20", metavar="N",
                        help="timed calls per size (default: 20)")
    parser.add_argument("--warmup", default="5", metavar="N",
                        help="untimed calls per size first (default: 5)")
    parser.add_argument("--json", dest="json_path", metavar="FILE",
                        help="write the results as JSON")
    parser.add_argument("--csv", dest="csv_path", metavar="FILE", help="write the rows as CSV")
    parser.add_argument("--plot", dest="plot_path", metavar="FILE.png",
                        help="draw busbw against size (needs matplotlib: unirank[plot])")
    parser.add_argument("--progress", default="auto", metavar="WHEN",
                        help="progress bar on stderr: auto (when stderr is a terminal), on, off")


def config_from(args: argparse.Namespace) -> BenchConfig:
    """The validated options; ConfigError (one line, exit 2) on a bad value.

    Reads no environment variable; ``--progress auto`` asks whether stderr is a terminal.
    """
    choose(args.backend, BACKENDS, "--backend")
    progress = choose(args.progress, ("auto", "on", "off"), "--progress")
    raw = getattr(args, "raw_argv", None)
    return make_config(
        op=args.op, dtype=args.dtype, min_bytes=args.min_bytes, max_bytes=args.max_bytes,
        step_factor=args.step_factor, iters=args.iters, warmup=args.warmup,
        progress=progress == "on" or (progress == "auto" and sys.stderr.isatty()),
        json_path=args.json_path, csv_path=args.csv_path, plot_path=args.plot_path,
        command=shlex.join(["unirank", "bench", *raw]) if raw is not None else "unirank bench",
    )


def main(args: argparse.Namespace) -> int:
    """Benchmark on every rank. Reads: see :func:`unirank.cli.hello.launch`."""
    config = config_from(args)
    if config.plot_path:
        from unirank.bench.plot import missing

        problem = missing()
        if problem:
            print(problem, file=sys.stderr)
            return USAGE
    from unirank.bench.worker import run_bench

    return launch("bench", args, functools.partial(run_bench, config=config))
