"""torchrun's restart budget, pure: which ended attempts spend one of ``--max-restarts``
(TORCHELASTIC_RESTART_COUNT counts them) and whether the run ends with an attempt.

As torch elastic's agent (``elastic/agent/server/api.py``: "membership changes do not count as
retries"): a failed or unhealthy attempt spends a restart, a change of membership does not.
So nodes waiting to join are admitted at any budget, also at ``--max-restarts 0``, while a
lost node spends one restart on every node that goes on without it, as the survivors'
collective fails under torchrun (a node killed and started again N times needs N restarts,
its rejoins none). :mod:`.attempts` carries the decisions out.

Reads (from the ``environ`` it is given): SLURM_JOB_ID, SLURM_JOBID.
"""

from __future__ import annotations

from collections.abc import Mapping

from unirank.launchers import slurm_vars
from unirank.supervisor.summary import RunResult

__all__ = ["is_last", "restarting_words", "spends_restart"]


def spends_restart(result: RunResult, *, joining: bool) -> bool:
    """Whether restarting after the attempt that ended with ``result`` spends a restart: it
    does after a worker failed (also on its lost peers), the hang timeout, a node lost, a
    peer node's new round after its own failure, the workers stopped to be requeued (outside
    Slurm); it does not where only nodes waiting to join stopped the workers (``joining``: the
    rendezvous's news said so) and no worker failed."""
    return not (joining and result.first_failure is None and result.world_changed is not None)


def is_last(result: RunResult, spent: int, max_restarts: int, environ: Mapping[str, str], *,
            joining: bool = False) -> bool:
    """Whether the run ends with this attempt (``spent``: the restarts spent before it): it
    succeeded, a stop signal ended it, a worker stuck in D state did (:mod:`.dstate`), it
    stopped to be requeued under Slurm (the batch script requeues the job), or restarting
    would spend a restart (:func:`spends_restart`) and none is left."""
    return bool(result.exit_code == 0 or result.stop_signal is not None
                or result.stuck is not None
                or (result.requeued and slurm_vars.in_job(environ))
                or (spent >= max_restarts and spends_restart(result, joining=joining)))


def restarting_words(spent: int, max_restarts: int, *, spends: bool) -> str:
    """The end of an attempt's restart line: ``restarting the workers (2 of 3 restarts)``
    (``spent``: before this restart), or for nodes joining ``restarting the workers for the
    nodes joining (no restart spent; 1 of 3 spent)``."""
    if spends:
        return f"restarting the workers ({spent + 1} of {max_restarts} restarts)"
    return (f"restarting the workers for the nodes joining (no restart spent; {spent} of "
            f"{max_restarts} spent)")
