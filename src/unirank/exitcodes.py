"""Every exit code unirank gives a meaning to, and that meaning: the one home of each number.

=====  ======================  ==========================================================
code   name                    means
=====  ======================  ==========================================================
2      :data:`USAGE`           refused before anything started: one line names the option,
                               variable or file and the value (``unirank run``, ``sbatch``,
                               ``bench``; a node that refused to start its workers)
79     :data:`REQUEUE`         stopped after saving, to run again: a rank
                               (``ur.exit_for_requeue()``), ``unirank run`` when every worker
                               did, the job's step; the batch script requeues on it
86     :data:`HANG_TIMEOUT`    ``--hang-timeout``: a hang lasted that long, the job was ended
87     :data:`EVICTED`         this node was evicted (``--on-hang evict``): its ranks never
                               entered the collective the others waited in; the job goes on
                               without it
130    :data:`INTERRUPTED`     128 + SIGINT: a Ctrl-C stopped the run (or a rank at start-up)
143    :data:`TERMINATED`      128 + SIGTERM: stopped after saving on Slurm's SIGTERM while
                               Slurm ends the job for good (scancel, the time limit): not
                               requeued
=====  ======================  ==========================================================

Any other 128 + N is a process ended by signal N (:func:`killed_by`), as a shell reports it.

Why 79 for a requeue: it is used by none of the programs between the batch shell and a rank:

* Python exits 1 on an uncaught exception and 2 on a usage error (argparse);
* torchrun and ``unirank run`` exit 1 when a worker fails;
* shells use 126 (not executable), 127 (not found) and 128 + N (killed by signal N, up to 192);
* coreutils ``timeout`` uses 124 and 125; systemd 200..243;
* ``sysexits.h`` spans 64..78 (EX_USAGE .. EX_CONFIG), so 79 is the first code past it;
* Slurm reports a task's signal apart from its exit code, and ``srun``'s own errors exit 1.

``srun`` exits with the highest exit code of its tasks: when every rank stops at the same step
(as unirank's stop agreement makes them) the step exits 79; a rank that dies of a signal
(128 + N) outweighs it and the job is not requeued. A rank that fails with 1..78 while the
others stop with 79 is outweighed by 79: the restart count caps how often that can repeat.

86 is past 79 and below the shells' 126, and no program on the way uses it; 87 follows it
for the hang's other end, the eviction of a node (not 2: the node did start; not 1: a
scheduler's retry policy, such as a Kubernetes Job's ``podFailurePolicy`` on exit codes, can
tell a node left out of a running job from a failed one).

Imports nothing; reads no environment variable.
"""

from __future__ import annotations

import signal

__all__ = ["EVICTED", "HANG_TIMEOUT", "INTERRUPTED", "MEANINGS", "REQUEUE", "TERMINATED",
           "USAGE", "killed_by"]

#: a refusal before anything started (one line)
USAGE = 2
#: stopped after saving, to run again (the job is requeued)
REQUEUE = 79
#: ``--hang-timeout``: the job was ended because a hang lasted that long
HANG_TIMEOUT = 86
#: ``--on-hang evict`` or ``--on-slow evict``: this node was left out of the job (its ranks hung,
#: or kept the others waiting)
EVICTED = 87
#: a Ctrl-C (SIGINT) stopped it
INTERRUPTED = 128 + int(signal.SIGINT)
#: stopped after saving on Slurm's SIGTERM while Slurm ends the job for good
TERMINATED = 128 + int(signal.SIGTERM)

#: each code's meaning, in a word or two (for messages and the docs)
MEANINGS: dict[int, str] = {
    USAGE: "refused (bad option or value)",
    REQUEUE: "stopped to be requeued",
    HANG_TIMEOUT: "ended by --hang-timeout",
    EVICTED: "evicted by --on-hang evict",
    INTERRUPTED: "interrupted (SIGINT)",
    TERMINATED: "stopped on SIGTERM, not requeued",
}


def killed_by(signum: int) -> int:
    """The exit code of a process ended by signal ``signum``, as a shell reports it."""
    return 128 + int(signum)
