"""``unirank hello``: every rank says hello, in rank order.

Each rank makes its line ``[http://MASTER_ADDR:MASTER_PORT] hello from [NODE:BACKEND] process
RANK/WORLD``; rank 0 gathers them and prints them in rank order, so that the order holds under
any launcher, including those that relay each task's output on its own (srun, mpirun across
nodes). Without ``-n`` it runs in whatever launcher context it was started in
(plain ``unirank hello`` is ``process 0/1``); ``-n N`` spawns N local workers.

Also home of the options and the runner that ``unirank reduce`` shares. No torch at import.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """``--backend``, ``-n/--nproc-per-node``, ``--init-timeout`` (and a hidden ``--local_rank``).

    The examples use these options too.
    """
    parser.add_argument(
        "--backend",
        default="auto",
        help="backend: gloo, nccl, horovod, xla-tpu or auto (horovod under horovodrun, else "
        "nccl with a GPU per local rank, else gloo); default: auto",
    )
    parser.add_argument(
        "-n",
        "--nproc-per-node",
        "--nproc_per_node",
        dest="nproc_per_node",
        type=int,
        default=None,
        metavar="N",
        help="spawn N local workers (default: run in the launcher's context as it is)",
    )
    parser.add_argument(
        "--init-timeout",
        dest="init_timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds to wait for every rank to join (default: UNIRANK_INIT_TIMEOUT or 300)",
    )
    # torch.distributed.launch without --use_env passes --local_rank=N; detection reads it
    parser.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``unirank hello``."""
    add_launch_arguments(parser)


def master_url() -> str:
    """``http://MASTER_ADDR:MASTER_PORT`` as this rank knows it (the seeds' prefix)."""
    import unirank as ur

    env = ur.dist_env()
    return f"http://{env.master_addr}:{env.master_port}"


def hello_line() -> str:
    """This rank's hello line (the process group must be up, or the world serial)."""
    import unirank as ur

    return (
        f"[{master_url()}] hello from [{ur.hostname()}:{ur.backend()}] "
        f"process {ur.get_rank()}/{ur.get_world_size()}"
    )


def say_hello(local_rank: int) -> None:
    """Worker body: rank 0 prints every rank's hello line, in rank order."""
    import unirank as ur

    lines = ur.all_gather(hello_line())
    if ur.get_rank() == 0:
        print("\n".join(lines), flush=True)


def launch(command: str, args: argparse.Namespace, fn: Callable[[int], Any]) -> int:
    """Run ``fn`` on every rank as ``args`` say; print failures as one line; exit code.

    Reads: the launcher's variables, UNIRANK_INIT_TIMEOUT, MASTER_ADDR, MASTER_PORT.
    """
    import unirank as ur
    from unirank.joincheck import InitTimeoutError
    from unirank.runtime import InitError, WorkerFailedError
    from unirank.runtime.parallel import quiet_launcher_log

    quiet_launcher_log()
    try:
        with ur.Parallel(
            backend=args.backend,
            nproc_per_node=args.nproc_per_node,
            init_timeout=args.init_timeout,
        ) as parallel:
            parallel.run(fn)
    except (InitError, InitTimeoutError, WorkerFailedError) as exc:
        print(f"unirank {command}: error: {exc}", file=sys.stderr)
        return 1
    return 0


def main(args: argparse.Namespace) -> int:
    """Say hello from every rank. Reads: see :func:`launch`."""
    return launch("hello", args, say_hello)
