"""The exit code that tells "stopped to be requeued" from a failure.

A rank that saved its checkpoint and stops so that the job runs again exits with
:data:`REQUEUE_EXIT_CODE`. The batch script that ``unirank sbatch --requeue`` writes checks the
step's exit status and, on this code, requeues the job from the batch shell
(``scontrol requeue``), which also works where the ranks run in a container without
``scontrol``.

Why 79: it is used by none of the programs between the batch shell and a rank:

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
"""

from __future__ import annotations

__all__ = ["REQUEUE_EXIT_CODE"]

REQUEUE_EXIT_CODE = 79
