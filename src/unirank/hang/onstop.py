"""The hang report when the job is stopped: on a stop signal, and at torch's collective timeout.

The periodic report waits ``--hang-report-after`` seconds; a job stopped before that (the
user's Ctrl-C, the scheduler's SIGTERM) or ended by torch's own collective timeout would end
without one. So the same report is made once more, at the stop, when some rank has waited in
a collective for at least one watcher interval while another has not entered it (ranks that
all compute, or that waited only a moment, give no report: a plain Ctrl-C prints nothing).
The stacks are asked as for the periodic report (each rank's watcher answers on its next
interval), bounded by :data:`unirank.hang.timings.STOP_ANSWER`: a rank that does not
answer is named as such (frozen, or its interpreter held).

* **A stop signal under ``unirank run``** (the parent never imports torch): the supervisor
  of the node that runs rank 0, on its first SIGINT or SIGTERM while the workers run, starts
  this module as a short child process (``python -m unirank.hang.onstop ADDR PORT WORLD
  INTERVAL SIGNAL``, see :mod:`unirank.supervisor.stopreport`), which reads every rank's
  record from the store, asks for the stacks, and prints the report on its stdout; the
  supervisor shows it, then forwards the signal (a second one stops at once; a report that
  does not come in time is given up). Under Slurm, whose SIGTERM reaches every worker
  directly, there is no time for it.
* **torch's collective timeout** (gloo raises ``RuntimeError: ... Timed out waiting Nms for
  recv operation to complete`` in each rank that waited; afterwards its flight recorder
  counts the collective as completed): when an exception raised inside torch.distributed
  leaves the program of a rank whose last record showed it waiting in a collective, that
  rank's watcher
  (:func:`unirank.hang.failure.failure_report`) stops publishing (its waiting record
  stays), and the first such rank (one counter in the store) prints the report; the others
  wait for it a bounded time, so that their exit (which ends the job) does not cut it off.
  Each adds the wavefront to its exception as a note, which its traceback and its error file
  (the failure summary's ``error:`` line) show. Under ``unirank run`` the worker's target
  does it (:mod:`unirank.supervisor.worker.target`), under srun, mpirun or torchrun the
  excepthook that :func:`unirank.init` installs with the watcher.
* Under srun, mpirun or torchrun one task per rank, a stop signal goes straight to the
  ranks, whose handling of it is the program's (torchrun's contract): SIGTERM ends a rank at
  once, and a SIGINT's KeyboardInterrupt waits for the collective to return; no report.

Reads no environment variable.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Mapping
from typing import Any

from unirank.hang.detect import Hang, cannot_return, find_hangs
from unirank.hang.exchange import read_records, request_stacks
from unirank.hang.render import render_report
from unirank.hang.timings import STOP_ANSWER

__all__ = ["CANNOT_RETURN", "report_now"]

#: the exit status of the report's child when ranks wait in collectives none of them can ever
#: return from (:func:`unirank.hang.detect.cannot_return`): the stop then ends them early
CANNOT_RETURN = 3


def report_now(store: Any, world_size: int, interval: float, *, cause: str,
               own: Any = None, records: Mapping[int, Any] | None = None
               ) -> tuple[str, list[Hang]] | None:
    """The report of a hang seen now (a rank waited in a collective for ``interval`` seconds or
    more while another has not entered it), with every rank's stacks asked through ``store``
    (``own``: this process's watcher, which answers at once); None when no rank waits so.
    ``records``: every rank's record where the caller read them already; ``cause``: why the
    report is made (its first line)."""
    now = time.time()
    if records is None:
        records = read_records(store, world_size)
    hangs = find_hangs(records, world_size, interval, now)
    if not hangs:
        return None
    timeout = STOP_ANSWER.of(interval)
    stacks, missing, nodes = request_stacks(store, world_size, timeout, own=own)
    for hang in hangs:
        nodes.update({r: n for r, n in hang.nodes.items() if n})
    text = render_report(hangs, stacks, unanswered=missing, number=0, report_after=interval,
                         nodes=nodes, answer_timeout=timeout, cause=cause)
    return text, hangs


def _main(argv: list[str]) -> int:
    """The child of :mod:`unirank.supervisor.stopreport`: the report on stdout, if any."""
    from unirank.store import StoreError, open_store

    addr, port, world, interval, signame = argv
    try:
        store = open_store(addr, int(port), rank=-1, timeout=1.0, hint="")
        made = report_now(store, int(world), float(interval), cause=f"on {signame}")
    except (StoreError, RuntimeError, OSError, ValueError):
        return 1
    if made is None:
        return 0
    with contextlib.suppress(OSError):
        sys.stdout.write(made[0])
        sys.stdout.flush()
    return CANNOT_RETURN if cannot_return(made[1]) else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
