"""Ranks started by IBM's ``jsrun`` in an LSF job (Summit, Lassen, ...).

jsrun sets ``JSM_NAMESPACE_RANK``, ``JSM_NAMESPACE_SIZE``, ``JSM_NAMESPACE_LOCAL_RANK`` (and
``JSM_NAMESPACE_LOCAL_SIZE``). The job's hosts come from ``LSB_DJOB_RANKFILE`` (one line per slot)
or ``LSB_MCPU_HOSTS`` (``host slots host slots ...``). On jsrun systems the first host listed is the
launch ("batch") node, which runs no task: it is skipped, and the master is the first compute host.
An LSF job without jsrun is left to the MPI launcher that started its ranks.
"""

from __future__ import annotations

from collections.abc import Mapping

from unirank.distenv import DistEnv
from unirank.errors import ConfigError
from unirank.launchers._base import Context, Launcher
from unirank.launchers._mpi import MpiVars, build

NAME = "lsf"
VARS = MpiVars(
    rank="JSM_NAMESPACE_RANK",
    size="JSM_NAMESPACE_SIZE",
    local_rank=("JSM_NAMESPACE_LOCAL_RANK",),
    local_size=("JSM_NAMESPACE_LOCAL_SIZE",),
    job_id=("LSB_JOBID",),
)


def compute_hosts(environ: Mapping[str, str], ctx: Context) -> tuple[tuple[str, ...], str]:
    """The job's compute hosts in order, without the launch node, and the variable used.

    Reads: LSB_DJOB_RANKFILE (reads the file), LSB_MCPU_HOSTS.
    """
    rankfile = environ.get("LSB_DJOB_RANKFILE", "").strip()
    if rankfile:
        try:
            text = ctx.read_text(rankfile)
        except OSError as exc:
            raise ConfigError(
                f"cannot be read ({exc.strerror or exc})", variable="LSB_DJOB_RANKFILE",
                value=rankfile, hint="run inside the LSF job, where LSF writes this file",
            ) from None
        hosts = tuple(dict.fromkeys(line.strip() for line in text.splitlines() if line.strip()))
        var = "LSB_DJOB_RANKFILE"
    elif environ.get("LSB_MCPU_HOSTS", "").strip():
        words = environ["LSB_MCPU_HOSTS"].split()
        if len(words) % 2:
            raise ConfigError(
                "is not a list of 'host slots' pairs", variable="LSB_MCPU_HOSTS",
                value=environ["LSB_MCPU_HOSTS"], hint="LSF writes 'hostA 4 hostB 4'",
            )
        hosts = tuple(dict.fromkeys(words[0::2]))
        var = "LSB_MCPU_HOSTS"
    else:
        return (), ""
    return (hosts[1:] if len(hosts) > 1 else hosts), f"{var} (launch node skipped)"


def detect(environ: Mapping[str, str], ctx: Context) -> DistEnv | None:
    """A jsrun rank, or None.

    Reads: JSM_NAMESPACE_RANK, JSM_NAMESPACE_SIZE, JSM_NAMESPACE_LOCAL_RANK,
    JSM_NAMESPACE_LOCAL_SIZE, LSB_JOBID, LSB_DJOB_RANKFILE, LSB_MCPU_HOSTS, MASTER_ADDR,
    MASTER_PORT.
    """
    if VARS.rank not in environ and VARS.size not in environ:
        return None
    hosts, hosts_var = compute_hosts(environ, ctx)
    return build(NAME, VARS, environ, ctx, hosts=hosts, hosts_var=hosts_var)


LAUNCHER = Launcher(NAME, detect, keys=(VARS.rank, VARS.size))
