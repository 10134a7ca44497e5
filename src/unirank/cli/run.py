"""``unirank run``: start this node's workers with torchrun's environment, and supervise them.

``unirank run [options] SCRIPT [ARGS...]`` or ``unirank run [options] -m MODULE [ARGS...]``:
everything after SCRIPT (or MODULE) goes to the script. Inside srun or mpirun with one task per
node it is the per-node launcher; in a Slurm allocation shell with no step it starts itself
through srun. The parent process never imports torch.

Reads: UNIRANK_INIT_TIMEOUT, UNIRANK_NO_SRUN, MASTER_ADDR, MASTER_PORT, CUDA_VISIBLE_DEVICES and
whatever the outer launcher's detection reads (see :mod:`unirank.launchers`).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import uuid
from collections.abc import Mapping

from unirank.distenv import DistEnv
from unirank.errors import ConfigError
from unirank.supervisor.plan import RunRequest

_EPILOG = (
    "Examples: unirank run -n 4 train.py --lr 0.1 | unirank run --nproc_per_node gpu -m pkg.train"
    " | srun -N2 --ntasks-per-node=1 unirank run -n 4 train.py"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``unirank run`` (torchrun's spellings are accepted too)."""
    parser.epilog = _EPILOG
    parser.add_argument(
        "-n", "--nproc-per-node", "--nproc_per_node", dest="nproc_per_node", default="auto",
        metavar="N|auto|gpu|cpu",
        help="workers on this node: a number, 'auto' (GPUs if any, else 1; the default), "
        "'gpu' or 'cpu'",
    )
    parser.add_argument("--nnodes", default=None, metavar="N",
                        help="number of nodes (default: from the outer launcher, else 1)")
    parser.add_argument("--node-rank", "--node_rank", dest="node_rank", default=None,
                        metavar="R", help="this node's rank (default: from the launcher, else 0)")
    parser.add_argument("--master-addr", "--master_addr", dest="master_addr", default=None,
                        metavar="ADDR", help="host of rank 0 (default: launcher, MASTER_ADDR, "
                        "or 127.0.0.1 on one node)")
    parser.add_argument("--master-port", "--master_port", dest="master_port", default=None,
                        metavar="PORT", help="rendezvous port (default: launcher, MASTER_PORT, "
                        "or a free port on one node)")
    parser.add_argument("--standalone", action="store_true",
                        help="one node on its own, with a free port (ignores outer launchers)")
    parser.add_argument("--init-timeout", "--init_timeout", dest="init_timeout", default=None,
                        metavar="S", help="seconds for every rank to join before each fails "
                        "naming the missing ones (default: UNIRANK_INIT_TIMEOUT, else 300)")
    parser.add_argument("--tag-output", "--tag_output", dest="tag_output", action="store_true",
                        help="prefix every line of output with [rankN]:")
    parser.add_argument("--grace-period", "--grace_period", dest="grace_period", default="5",
                        metavar="S", help="seconds between SIGTERM and SIGKILL when stopping "
                        "workers (default 5)")
    parser.add_argument("-m", "--module", dest="module", action="store_true",
                        help="run PROGRAM as a module, like python -m")
    parser.add_argument("program", metavar="SCRIPT|MODULE", nargs="?",
                        help="the script (or module) to run")
    parser.add_argument("program_args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="arguments for the script")


def _detect(environ: Mapping[str, str]) -> DistEnv:
    from unirank.launchers import detect

    return detect(environ, sys.argv)


def _int_option(value: str | None, option: str, hint: str) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError("is not an integer", variable=option, value=value, hint=hint) from None


def build_request(args: argparse.Namespace, environ: Mapping[str, str]) -> RunRequest:
    """The validated :class:`RunRequest` for the parsed options.

    Reads: UNIRANK_INIT_TIMEOUT, CUDA_VISIBLE_DEVICES.
    """
    from unirank.rendezvous import parse_port
    from unirank.supervisor.devices import visible_gpu_count
    from unirank.supervisor.plan import (
        parse_nnodes,
        parse_nproc,
        parse_seconds,
        resolve_init_timeout,
    )

    nproc_text = str(args.nproc_per_node)
    needs_gpus = nproc_text.strip().lower() in ("auto", "gpu")
    nproc = parse_nproc(
        nproc_text,
        gpu_count=visible_gpu_count(environ) if needs_gpus else 0,
        cpu_count=os.cpu_count(),
    )
    return RunRequest(
        nproc_per_node=nproc,
        nnodes=parse_nnodes(args.nnodes) if args.nnodes is not None else None,
        node_rank=_int_option(args.node_rank, "--node-rank",
                              "give this node's rank, 0 to --nnodes - 1"),
        master_addr=args.master_addr.strip() if args.master_addr else None,
        master_port=(parse_port(args.master_port, "--master-port")
                     if args.master_port is not None else None),
        standalone=bool(args.standalone),
        init_timeout=resolve_init_timeout(args.init_timeout, environ),
        tag_output=bool(args.tag_output),
        grace_period=parse_seconds(str(args.grace_period), "--grace-period", allow_zero=True),
    )


def target_of(args: argparse.Namespace) -> list[str]:
    """``[SCRIPT, ARGS...]`` or ``["-m", MODULE, ARGS...]``."""
    program_args = list(args.program_args)
    if program_args and program_args[0] == "--":
        program_args = program_args[1:]
    if args.module:
        return ["-m", args.program, *program_args]
    return [args.program, *program_args]


def inner_command(args: argparse.Namespace, request: RunRequest, nnodes: int) -> list[str]:
    """This ``unirank run`` as a command line for each node of an srun step."""
    command = [sys.executable, "-m", "unirank", "run",
               "--nproc-per-node", str(request.nproc_per_node),
               "--nnodes", str(nnodes),
               "--init-timeout", f"{request.init_timeout:g}",
               "--grace-period", f"{request.grace_period:g}"]
    if request.master_addr:
        command += ["--master-addr", request.master_addr]
    if request.master_port:
        command += ["--master-port", str(request.master_port)]
    if request.tag_output:
        command.append("--tag-output")
    target = target_of(args)
    if target[0] != "-m" and target[0].startswith("-"):
        command.append("--")
    return [*command, *target]


def _nproc_in_allocation(args: argparse.Namespace, request: RunRequest, outer: DistEnv) -> int:
    """``-n`` for the nodes of an allocation: as given, else the allocation's tasks per node
    when it planned several (``sbatch --ntasks-per-node=4``), else ``auto``'s answer."""
    if str(args.nproc_per_node).strip().lower() != "auto" or not outer.planned_tasks:
        return request.nproc_per_node
    nodes = max(1, outer.num_nodes)
    per_node, rest = divmod(outer.planned_tasks, nodes)
    if rest == 0 and per_node > 1:
        return per_node
    return request.nproc_per_node


def main(args: argparse.Namespace) -> int:
    """Plan, start and supervise this node's workers; returns the exit code."""
    from dataclasses import replace

    from unirank.supervisor.plan import make_plan

    if args.program is None:
        raise ConfigError(
            "no script or module to run",
            hint="unirank run [options] script.py [args...]  or  unirank run [options] -m module",
        )
    environ = dict(os.environ)
    request = build_request(args, environ)
    outer = _detect(environ)
    if outer.launch_required and not request.standalone:
        from unirank.supervisor.reexec import reexec_through_srun

        nnodes = request.nnodes if request.nnodes is not None else max(1, outer.num_nodes)
        request = replace(request, nproc_per_node=_nproc_in_allocation(args, request, outer))
        reexec_through_srun(nnodes, inner_command(args, request, nnodes), environ)
    if request.standalone:
        outer = DistEnv(launcher="local", node_name=outer.node_name)
    plan = make_plan(request, outer, environ, hostname=socket.gethostname(),
                     run_id_fallback=uuid.uuid4().hex)

    from unirank.supervisor.procs import run_plan
    from unirank.supervisor.summary import format_summary

    result = run_plan(plan, target_of(args), environ=environ, tag_output=request.tag_output,
                      grace_period=request.grace_period)
    summary = format_summary(result)
    if summary:
        sys.stderr.write(summary)
        sys.stderr.flush()
    return result.exit_code

