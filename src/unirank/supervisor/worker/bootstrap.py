"""The first code a ``unirank run`` or ``Parallel`` worker runs:
``python -m unirank.supervisor.worker.bootstrap TARGET``.

TARGET is ``SCRIPT [ARGS...]``, ``-m MODULE [ARGS...]``, ``--exec PROGRAM [ARGS...]``
(``unirank run --no-python``) or ``--call FILE`` (a function that
:class:`~unirank.runtime.parallel.Parallel` pickled).

This entry only arms the parent-death signal (SIGKILL when the supervisor dies; at once if the
supervisor is already gone), before anything slow, and hands over to
:func:`unirank.supervisor.worker.main.run_worker`, which hosts or joins the store
(:mod:`.store`), runs the target (:mod:`.target`) and keeps the store up until every rank
is done with it.

Reads: UNIRANK_SUPERVISOR_PID (and, in :mod:`.main`, the rest of the worker's environment).
"""

from __future__ import annotations

import os
import signal
import sys
import time

__all__ = ["main"]


def main() -> None:
    """Arm the parent-death signal, then run the worker (see the module docstring).

    Reads: UNIRANK_SUPERVISOR_PID.
    """
    entered_at = time.time()  # the timeline's "bootstrap entered"
    from unirank.contract import SUPERVISOR_PID_VAR

    supervisor = os.environ.get(SUPERVISOR_PID_VAR, "")
    if supervisor.isdigit():
        from unirank.supervisor.worker.pdeathsig import die_with_parent

        die_with_parent(int(supervisor), signal.SIGKILL)
    import atexit

    from unirank.supervisor.worker.main import run_worker
    from unirank.supervisor.worker.target import flush_open_streams

    atexit.register(flush_open_streams)  # runs after the program's own handlers
    run_worker(sys.argv[1:], entered_at=entered_at, environ=os.environ)


if __name__ == "__main__":
    main()
