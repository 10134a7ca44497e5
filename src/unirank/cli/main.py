"""``unirank`` entry point: a thin dispatcher that imports a subcommand's module only when used.

Each subcommand module defines ``add_arguments(parser)`` and ``main(args) -> int``; its one-line
help lives here, in :data:`SUBCOMMANDS`, so that ``unirank --help`` imports none of them. None of
them may import torch at module level.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from unirank import __version__
from unirank.cli.usage import one_line_errors
from unirank.errors import ConfigError
from unirank.exitcodes import INTERRUPTED, USAGE

#: subcommand name -> module under ``unirank.cli``, in the order ``--help`` lists them.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "info": ("unirank.cli.info", "show the detected launcher, ranks, master address and port"),
    "run": ("unirank.cli.run", "start local workers with torchrun's environment (like torchrun)"),
    "hello": ("unirank.cli.hello", "every rank says hello, in rank order"),
    "reduce": ("unirank.cli.reduce", "all_reduce a tensor of ones; every rank prints the sum"),
    "check": ("unirank.cli.check", "report torch, CUDA, launcher and NCCL/GLOO/TORCH settings"),
    "sbatch": ("unirank.cli.sbatch", "write a job's Slurm batch script; print or submit it"),
    "bench": ("unirank.cli.bench", "collective bandwidth per message size, like nccl-tests"),
    "stacks": ("unirank.cli.stacks", "every rank's progress and Python stack of a running job"),
    "top": ("unirank.cli.top", "a live view of every rank of a running job, every second"),
    "doctor": ("unirank.cli.doctor", "pre-flight checks: layout, master, port, interfaces, group"),
}


def _load(name: str) -> ModuleType:
    return importlib.import_module(SUBCOMMANDS[name][0])


def build_parser(command: str | None) -> argparse.ArgumentParser:
    """The top-level parser; only ``command``'s module is imported to add its arguments."""
    parser = argparse.ArgumentParser(
        prog="unirank",
        description="Run one PyTorch distributed script under python, torchrun, Slurm or MPI.",
    )
    parser.add_argument("--version", action="version", version=f"unirank {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text, prog=f"unirank {name}")
        one_line_errors(sp)
        if name == command:
            _load(name).add_arguments(sp)  # may give its own hints (one_line_errors again)
            parser.set_defaults(_subparser=sp)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the subcommand; returns the process exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in args_list if not a.startswith("-")), None)
    if command not in SUBCOMMANDS:
        command = None
    parser = build_parser(command)
    args, extras = parser.parse_known_args(args_list)
    if extras:  # the subcommand's usage, not the top-level one
        target = getattr(args, "_subparser", None) or parser
        target.error(f"unrecognized arguments: {' '.join(extras)}")
    if command is not None:
        args.raw_argv = args_list[args_list.index(command) + 1:]
    if args.command is None:
        parser.print_help()
        return USAGE
    try:
        return int(_load(args.command).main(args))
    except ConfigError as exc:
        print(f"unirank {args.command}: error: {exc}", file=sys.stderr)
        # 1 where torchrun's own refusal ends so; EVICTED for a node --on-hang evict left out
        return USAGE if exc.exit_code is None else exc.exit_code
    except KeyboardInterrupt:
        return INTERRUPTED


def entry() -> None:  # pragma: no cover - thin wrapper
    sys.exit(main())
