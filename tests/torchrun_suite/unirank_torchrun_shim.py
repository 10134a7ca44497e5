"""Points torch's launcher at ``unirank run`` for torch's own launcher tests (a pytest plugin:
``-p unirank_torchrun_shim``).

At pytest's start, :func:`main` replaces ``torch.distributed.run.main`` and :func:`launch_main`
replaces ``torch.distributed.launch.main``: the tests call ``launch.main(args)`` (``import
torch.distributed.run as launch`` or ``import torch.distributed.launch as launch``), in the test
process or in a ``multiprocessing`` child forked from it, and get ``python -m unirank run ARGS``
instead, in a
subprocess with the test process's environment as it is at the call (the ``PET_*`` variables
and ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` the tests set). What it writes is passed on to
``sys.stdout``/``sys.stderr`` (which the tests may have redirected). Its end is told as
torchrun's ``main`` tells it: nothing on success; ``ValueError`` for a refused command line
(``unirank run: error: ...``, torchrun's ValueError or argparse exit); ``ChildFailedError``
when workers failed. ``torch.distributed.launch``'s own option ``--use-env`` (torchrun's way,
the local rank in ``LOCAL_RANK``) is dropped; without it, that deprecated launcher passes
``--local-rank=N`` to the script, which ``unirank run`` (torchrun's replacement) does not: the shim
refuses such a command line with a ``ValueError`` naming it.

Tests that mock torchrun's agent, call its helpers or patch fake GPUs into the test process
cannot reach ``unirank run``; tests/runtime/test_torchrun_suite.py lists them with the reason.

Environment variables read: the whole environment, handed to ``unirank run``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

#: seconds one launch may take before the shim kills it (torch's tests start 4 workers)
LAUNCH_TIMEOUT = 300.0


def main(args: Sequence[str] | None = None) -> None:
    """``unirank run ARGS`` in place of ``torch.distributed.run.main(ARGS)``."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    argv = list(sys.argv[1:] if args is None else args)
    try:
        proc = subprocess.run([sys.executable, "-m", "unirank", "run", *argv],
                              env=dict(os.environ), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        said = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else \
            exc.stderr or ""
        raise RuntimeError(f"unirank run {' '.join(argv)} ran past {LAUNCH_TIMEOUT:g} s; its "
                           f"stderr's end:\n{said[-3000:]}") from exc
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    if proc.returncode == 0:
        return
    refusals = [line for line in proc.stderr.splitlines()
                if line.startswith(("unirank run: error:", "usage: unirank run"))]
    if refusals:
        raise ValueError(refusals[-1])
    failure = ProcessFailure(local_rank=0, pid=0, exitcode=proc.returncode, error_file="")
    raise ChildFailedError(name="unirank run", failures={0: failure})


#: torch.distributed.launch's option (both spellings) that torchrun's behaviour is the default of
USE_ENV = ("--use-env", "--use_env")


def launch_main(args: Sequence[str] | None = None) -> None:
    """``unirank run ARGS`` in place of ``torch.distributed.launch.main(ARGS)``."""
    argv = list(sys.argv[1:] if args is None else args)
    if not any(a in USE_ENV for a in argv):
        raise ValueError("torch.distributed.launch without --use-env passes --local-rank=N to "
                         "the script; unirank run, as torchrun, gives it in LOCAL_RANK only")
    main([a for a in argv if a not in USE_ENV])


def pytest_configure(config: object) -> None:
    """Install the shim before the test modules import the launchers' ``main``."""
    import torch.distributed.launch
    import torch.distributed.run

    torch.distributed.run.main = main  # type: ignore[assignment]
    torch.distributed.launch.main = launch_main  # type: ignore[assignment]


def pytest_report_header(config: object) -> str:
    """Say which launcher the tests get."""
    return "torch.distributed.run.main: unirank run (tests/torchrun_suite/unirank_torchrun_shim.py)"
