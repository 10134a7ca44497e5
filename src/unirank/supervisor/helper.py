"""Helper processes, started one way: :func:`start_helper`.

A helper is a short or long child process of ``unirank run`` that is not a worker: the fork
server (:mod:`.fork.server`), the rendezvous helper (:mod:`.rdzv.agent`), the hang report's
child at a stop signal (:mod:`unirank.hang.onstop`) and the give-up child (:mod:`.giveup`).
Every one of them

* gets the run's environment: the mapping its caller passes, never ``os.environ``;
* runs in its own session, so that a terminal's Ctrl-C reaches only the supervisor;
* ignores :data:`unirank.signals.SHIELDED` (Slurm's ``scancel --signal`` and a time limit's
  SIGTERM reach every process of a step: they are for the program, and a helper's death would
  end the workers or look like a lost node); there is no window in which one of them kills
  the helper: the parent blocks them in its own thread around the fork (the child inherits
  the blocked mask across ``exec``), and the helper ignores, then unblocks them first thing;
* dies with the supervisor (the parent-death signal, SIGKILL), with the race check of
  :func:`~.worker.pdeathsig.die_with_parent`.

The helper runs as ``python -m unirank.supervisor.helper PARENT_PID MODULE ARGS...``: this
module's :func:`main` does the above, then runs MODULE as ``__main__`` with ``ARGS``, so the
helpers' own modules need nothing of it. A module that hands signals back to processes it
forks (the fork server's workers) takes the dispositions found at the start from
:func:`shield`.

Reads no environment variable.
"""

from __future__ import annotations

import os
import runpy
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import IO, Any, Union

from unirank.signals import SHIELDED

__all__ = ["HELPER_MODULE", "shield", "start_helper"]

#: the module every helper is started through
HELPER_MODULE = "unirank.supervisor.helper"

_Stream = Union[int, IO[Any], None]

#: the dispositions the helper found at its start (before :func:`shield`), once shielded
_FOUND: dict[int, Any] = {}


def start_helper(module: str, args: Sequence[str], environ: Mapping[str, str], *,
                 stdin: _Stream = subprocess.DEVNULL, stdout: _Stream = subprocess.DEVNULL,
                 stderr: _Stream = subprocess.DEVNULL,
                 pass_fds: Sequence[int] = ()) -> subprocess.Popen[bytes]:
    """Start ``python -m MODULE ARGS`` as a helper (see the module docstring) with exactly
    ``environ``; its Popen. OSError when the interpreter cannot be started."""
    command = [sys.executable, "-m", HELPER_MODULE, str(os.getpid()), module, *args]
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SHIELDED)
    try:
        return subprocess.Popen(command, env=dict(environ), stdin=stdin, stdout=stdout,
                                stderr=stderr, pass_fds=tuple(pass_fds),
                                start_new_session=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def shield() -> dict[int, Any]:
    """Ignore :data:`~unirank.signals.SHIELDED`, then unblock them (a signal that came while
    they were blocked is dropped); the dispositions they had before the first call."""
    if not _FOUND:
        for signum in SHIELDED:
            _FOUND[int(signum)] = signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SHIELDED)
    return dict(_FOUND)


def main(argv: list[str]) -> None:
    """``PARENT_PID MODULE ARGS...``: shield, die with the parent, run MODULE as ``__main__``."""
    shield()
    if len(argv) < 2 or not argv[0].isdigit():
        raise SystemExit("usage: python -m unirank.supervisor.helper PARENT_PID MODULE [ARGS]")
    from unirank.supervisor.worker.pdeathsig import die_with_parent

    die_with_parent(int(argv[0]), signal.SIGKILL)
    sys.argv = [argv[1], *argv[2:]]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    # through the importable module, whose _FOUND the helper's own module reads (shield())
    from unirank.supervisor.helper import main as _main

    _main(sys.argv[1:])
