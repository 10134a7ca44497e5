"""``python -m unirank.sbatch.jobenv MASTER_ADDR|MASTER_PORT|RDZV_SECRET``: a batch job's first
step's master, or a fresh rendezvous secret.

The lines ``unirank sbatch --explicit-env`` writes call this from the batch shell, so that the
values shown are those every rank of the job's first ``srun`` step derives on its own: the same
rules (:func:`unirank.launchers._base.resolve_master`, :mod:`unirank.rendezvous`), with the
job's first node as host and step 0 as step. MASTER_ADDR/MASTER_PORT already set win, as they
do in the ranks. ``RDZV_SECRET`` prints a fresh random secret for an elastic job's rendezvous
(:mod:`unirank.supervisor.rdzv.secret`): the batch shell keeps it in its environment, which its
steps pass to every node, so it is never in the script nor on a command line. Never imports
torch.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Mapping, Sequence

from unirank.envvars import first_set
from unirank.errors import ConfigError
from unirank.exitcodes import USAGE
from unirank.hostlist import first_host
from unirank.launchers import slurm_vars as V
from unirank.launchers._base import Master, MasterHint, resolve_master

__all__ = ["FIRST_STEP_ID", "batch_master", "main"]

#: the step id of a batch job's first ``srun``
FIRST_STEP_ID = "0"


def batch_master(environ: Mapping[str, str]) -> Master:
    """Rank 0's host and the port for the first step of the batch job described by ``environ``.

    Reads: SLURM_JOB_ID / SLURM_JOBID, SLURM_JOB_NODELIST / SLURM_NODELIST, MASTER_ADDR,
    MASTER_PORT.
    """
    jid, jid_var = V.job_id(environ)
    if jid is None:
        raise ConfigError("not in a Slurm job", variable=V.JOB_ID[0], value=None,
                          hint="python -m unirank.sbatch.jobenv runs in a batch script")
    hosts_var = first_set(environ, *V.JOB_NODELIST)
    hosts = (first_host(environ[hosts_var], variable=hosts_var),) if hosts_var else ()
    hint = MasterHint(hosts=hosts, hosts_source=hosts_var or "", job_id=jid,
                      step_id=FIRST_STEP_ID, job_source=jid_var)
    return resolve_master(environ, hint, single_node=not hosts)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Print the value of MASTER_ADDR or MASTER_PORT (the one argument) for this batch job, or
    a fresh rendezvous secret (RDZV_SECRET)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["RDZV_SECRET"]:
        print(secrets.token_hex(32))
        return 0
    if args not in (["MASTER_ADDR"], ["MASTER_PORT"]):
        print("usage: python -m unirank.sbatch.jobenv MASTER_ADDR|MASTER_PORT|RDZV_SECRET",
              file=sys.stderr)
        return USAGE
    try:
        master = batch_master(os.environ if environ is None else environ)
    except ConfigError as exc:
        print(f"unirank.sbatch.jobenv: error: {exc}", file=sys.stderr)
        return USAGE
    print(master.addr if args[0] == "MASTER_ADDR" else master.port)
    return 0


if __name__ == "__main__":  # pragma: no cover - the script's entry
    sys.exit(main())
