"""``unirank check``: report torch, CUDA, Slurm, the detected launcher and NCCL/GLOO/TORCH settings.

The report's text is the classic ``check_config.py`` output followed by unirank's additions (see
:mod:`unirank.report`); ``--json`` prints the same as one JSON object. Exit code 1 when launcher
detection fails (the report still prints, with the error). No torch at import.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from unirank.errors import ConfigError
from unirank.report import TorchFacts, build_report, format_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json`` for machine-readable output."""
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def torch_facts() -> TorchFacts:
    """Versions and CUDA devices as torch reports them (imports torch)."""
    import torch

    available = bool(torch.cuda.is_available())
    devices: tuple[str, ...] = ()
    if available:
        devices = tuple(
            str(torch.cuda.get_device_properties(i)) for i in range(torch.cuda.device_count())
        )
    return TorchFacts(
        version=str(torch.version.__version__),
        git_version=str(torch.version.git_version),
        cuda_available=available,
        cuda_version=torch.version.cuda,
        devices=devices,
    )


def main(args: argparse.Namespace) -> int:
    """Print the report. Reads: the whole environment (launcher detection, Slurm, NCCL_* ...)."""
    from unirank.launchers import detect

    error = None
    try:
        env = detect(os.environ, sys.argv)
    except ConfigError as exc:
        env, error = None, str(exc)
    report = build_report(torch_facts(), os.environ, env, error)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(format_report(report)))
    return 1 if error else 0
