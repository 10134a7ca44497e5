"""Launcher detection: who started this process, and where it stands in the job.

:func:`detect` is a pure function of an environment mapping (and the command line). It tries the
launchers in :data:`PRECEDENCE` order and returns the first match as a :class:`DistEnv`; bad
values raise :class:`ConfigError`, and nothing else is ever raised.

Precedence, and why:

1. ``UNIRANK_LAUNCHER=<name>`` forces a launcher; ``UNIRANK_LAUNCHER=none`` turns detection off.
2. ``torchrun`` - its workers (and ``unirank run``'s) often also carry the Slurm or MPI variables
   of the agent that started them; the torchrun variables describe the worker itself.
3. ``horovodrun`` - its gloo workers run inside a batch job (Slurm variables of the job, not
   of the workers) and its MPI mode runs mpirun (the MPI variables agree with Horovod's).
4. MPI launchers: ``openmpi``, ``mvapich``, ``mpich``/``intelmpi``, ``lsf`` (jsrun), ``pmix`` -
   an mpirun inside a Slurm job starts its daemons through srun, so its ranks also see a Slurm step
   whose numbers describe the daemons, not the ranks. Only the PMI flavours (``mpich``, ``pmix``)
   can also come from srun itself (``srun --mpi=pmi2|pmix``): when their numbers equal the step's,
   ``slurm`` is reported, since it also knows the nodes.
5. ``slurm`` - a task of an srun step.
6. ``pbs`` - a pbsdsh task.
7. ``kubeflow`` - RANK/WORLD_SIZE/MASTER_ADDR without LOCAL_RANK.
8. ``slurm-allocation`` - an sbatch or salloc shell with no step (``launch_required``).
9. ``local`` - none of the above: rank 0 of 1.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType

from unirank.distenv import DistEnv
from unirank.errors import ConfigError
from unirank.launchers import (
    horovodrun,
    kubeflow,
    local,
    lsf,
    mpich,
    mvapich,
    openmpi,
    pbs,
    pmix,
    slurm,
    slurm_allocation,
    torchrun,
)
from unirank.launchers._base import Context

__all__ = ["LAUNCHER_NAMES", "PRECEDENCE", "Candidate", "detect", "explain"]

#: launcher modules in the order they are tried
PRECEDENCE: tuple[ModuleType, ...] = (
    torchrun,
    horovodrun,
    openmpi,
    mvapich,
    mpich,
    lsf,
    pmix,
    slurm,
    pbs,
    kubeflow,
    slurm_allocation,
    local,
)
#: launchers whose variables srun itself may set (srun --mpi=pmi2 / --mpi=pmix)
_SRUN_PMI = (mpich, pmix)
#: every name UNIRANK_LAUNCHER accepts (besides "none"), mapped to its module
LAUNCHER_NAMES: dict[str, ModuleType] = {m.NAME: m for m in PRECEDENCE}
LAUNCHER_NAMES[mpich.INTEL_NAME] = mpich


@dataclass(frozen=True)
class Candidate:
    """One launcher as :func:`explain` saw it: chosen, matched but outranked, or absent."""

    name: str
    status: str  # "chosen" | "outranked" | "absent" | "error"
    reason: str


def _context(argv: Sequence[str] | None, read_text: Callable[[str], str] | None,
             hostname: str | None) -> Context:
    kwargs: dict[str, object] = {
        "argv": tuple(sys.argv[1:] if argv is None else argv),
        "hostname": hostname if hostname is not None else socket.gethostname(),
    }
    if read_text is not None:
        kwargs["read_text"] = read_text
    return Context(**kwargs)  # type: ignore[arg-type]


def _agrees_with_slurm(env: DistEnv, environ: Mapping[str, str], ctx: Context) -> DistEnv:
    """Prefer the Slurm view when an MPI rank is really an srun task (srun --mpi=...)."""
    if not slurm.in_step(environ):
        return env
    try:
        step = slurm.detect(environ, ctx)
    except ConfigError:
        return env
    same = ("rank", "world_size", "local_rank", "local_world_size")
    if step is not None and all(getattr(step, f) == getattr(env, f) for f in same):
        return step
    return env


def _forced(name: str, environ: Mapping[str, str], ctx: Context) -> DistEnv:
    if name == "none":
        return local.detect(environ, ctx)
    module = LAUNCHER_NAMES.get(name)
    if module is None:
        raise ConfigError(
            "is not a launcher unirank knows", variable="UNIRANK_LAUNCHER", value=name,
            hint=f"use one of: none, {', '.join(sorted(LAUNCHER_NAMES))}",
        )
    env: DistEnv | None = module.detect(environ, ctx)
    if env is None:
        keys = ", ".join(k for k in module.KEYS if not k.startswith("-"))
        raise ConfigError(
            f"forces the {name} launcher but its variables ({keys}) are not set",
            variable="UNIRANK_LAUNCHER", value=name,
            hint="unset UNIRANK_LAUNCHER to detect the launcher, or start the job with that one",
        )
    return env


def detect(
    environ: Mapping[str, str] | None = None,
    argv: Sequence[str] | None = None,
    *,
    read_text: Callable[[str], str] | None = None,
    hostname: str | None = None,
) -> DistEnv:
    """Detect the launcher that started this process and return this process's :class:`DistEnv`.

    ``environ`` defaults to ``os.environ`` and ``argv`` to ``sys.argv[1:]``; ``read_text`` reads
    the files some launchers name (PBS_NODEFILE, LSB_DJOB_RANKFILE) and ``hostname`` is used when
    no launcher names the node. Raises :class:`ConfigError` (and nothing else) on bad values.

    Reads: UNIRANK_LAUNCHER, and every variable the launcher modules read.
    """
    env_map: Mapping[str, str] = os.environ if environ is None else environ
    try:
        ctx = _context(argv, read_text, hostname)
        forced = env_map.get("UNIRANK_LAUNCHER", "").strip().lower()
        if forced:
            return _forced(forced, env_map, ctx)
        for module in PRECEDENCE:
            found: DistEnv | None = module.detect(env_map, ctx)
            if found is not None:
                return _agrees_with_slurm(found, env_map, ctx) if module in _SRUN_PMI else found
    except ConfigError:
        raise
    except Exception as exc:  # a bug must not look like a hang or a traceback to users
        raise ConfigError(
            f"launcher detection failed unexpectedly: {type(exc).__name__}: {exc}",
            hint="please report this with the output of `env | sort`",
        ) from exc
    raise AssertionError("unreachable: the local launcher always matches")  # pragma: no cover


def explain(
    environ: Mapping[str, str] | None = None,
    argv: Sequence[str] | None = None,
    *,
    read_text: Callable[[str], str] | None = None,
    hostname: str | None = None,
) -> list[Candidate]:
    """Each launcher in precedence order, with why it was or was not chosen."""
    env_map: Mapping[str, str] = os.environ if environ is None else environ
    ctx = _context(argv, read_text, hostname)
    try:
        chosen: str | None = detect(env_map, argv, read_text=read_text, hostname=hostname).launcher
    except ConfigError:
        chosen = None
    forced = env_map.get("UNIRANK_LAUNCHER", "").strip().lower()
    out: list[Candidate] = []
    for module in PRECEDENCE:
        keys = [k for k in module.KEYS if not k.startswith("-")]
        try:
            found = module.detect(env_map, ctx)
        except ConfigError as exc:
            out.append(Candidate(module.NAME, "error", str(exc)))
            continue
        if found is None:
            missing = [k for k in keys if k not in env_map]
            reason = f"not set: {', '.join(missing)}" if missing else "its variables are incomplete"
            if module is slurm_allocation and slurm.in_step(env_map):
                reason = "inside an srun step"
            out.append(Candidate(module.NAME, "absent", reason))
        elif found.launcher == chosen or (chosen == "slurm" and module is slurm):
            why = f"forced by UNIRANK_LAUNCHER={forced}" if forced else "first match in precedence"
            out.append(Candidate(found.launcher, "chosen", why))
        else:
            why = f"UNIRANK_LAUNCHER={forced}" if forced else f"outranked by {chosen}"
            out.append(Candidate(found.launcher, "outranked", f"variables present, but {why}"))
    return out
