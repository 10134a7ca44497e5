"""Launcher detection: who started this process, and where it stands in the job.

:func:`detect` is a pure function of an environment mapping (and the command line). It tries the
launchers in :data:`PRECEDENCE` order and returns the first match as a :class:`DistEnv`; bad
values raise :class:`ConfigError`, and nothing else is ever raised. Each launcher is a typed
entry (:class:`Launcher`, ``LAUNCHER`` in its module) whose ``detect`` reads its variables into a
layout and ends with the common :func:`~unirank.launchers._base.finish` (master, node name by
:func:`node_name`, ids, sources).

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
8. ``skypilot`` - SKYPILOT_NODE_RANK/SKYPILOT_NUM_NODES: one process per node (its variables
   describe the node, so every per-process launcher above, torchrun or mpirun started inside
   the ``run:`` command, wins).
9. ``slurm-allocation`` - an sbatch or salloc shell with no step (``launch_required``).
10. ``local`` - none of the above: rank 0 of 1.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from unirank.contract import LAUNCHER_VAR
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
    skypilot,
    slurm,
    slurm_allocation,
    torchrun,
)
from unirank.launchers._base import Context, Launcher, node_name

__all__ = ["LAUNCHER_NAMES", "PRECEDENCE", "Candidate", "Launcher", "detect", "explain",
           "node_name"]

#: the launchers in the order they are tried
PRECEDENCE: tuple[Launcher, ...] = (
    torchrun.LAUNCHER,
    horovodrun.LAUNCHER,
    openmpi.LAUNCHER,
    mvapich.LAUNCHER,
    mpich.LAUNCHER,
    lsf.LAUNCHER,
    pmix.LAUNCHER,
    slurm.LAUNCHER,
    pbs.LAUNCHER,
    kubeflow.LAUNCHER,
    skypilot.LAUNCHER,
    slurm_allocation.LAUNCHER,
    local.LAUNCHER,
)
#: every name UNIRANK_LAUNCHER accepts (besides "none"), mapped to its launcher
LAUNCHER_NAMES: dict[str, Launcher] = {
    name: entry for entry in PRECEDENCE for name in (entry.name, *entry.aliases)
}


@dataclass(frozen=True)
class Candidate:
    """One launcher as :func:`explain` saw it: chosen, matched but outranked, or absent."""

    name: str
    status: str  # "chosen" | "outranked" | "absent" | "error"
    reason: str


def _context(argv: Sequence[str] | None, read_text: Callable[[str], str] | None,
             hostname: str | None) -> Context:
    name = hostname if hostname is not None else socket.gethostname()
    args = tuple(sys.argv[1:] if argv is None else argv)
    if read_text is None:
        return Context(argv=args, hostname=name)
    return Context(argv=args, read_text=read_text, hostname=name)


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
    entry = LAUNCHER_NAMES.get(name)
    if entry is None:
        raise ConfigError(
            "is not a launcher unirank knows", variable=LAUNCHER_VAR, value=name,
            hint=f"use one of: none, {', '.join(sorted(LAUNCHER_NAMES))}",
        )
    env = entry.detect(environ, ctx)
    if env is None:
        keys = ", ".join(k for k in entry.keys if not k.startswith("-"))
        raise ConfigError(
            f"forces the {name} launcher but its variables ({keys}) are not set",
            variable=LAUNCHER_VAR, value=name,
            hint=f"unset {LAUNCHER_VAR} to detect the launcher, or start the job with that one",
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
        forced = env_map.get(LAUNCHER_VAR, "").strip().lower()
        if forced:
            return _forced(forced, env_map, ctx)
        for entry in PRECEDENCE:
            found = entry.detect(env_map, ctx)
            if found is not None:
                return _agrees_with_slurm(found, env_map, ctx) if entry.srun_pmi else found
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
    forced = env_map.get(LAUNCHER_VAR, "").strip().lower()
    out: list[Candidate] = []
    for entry in PRECEDENCE:
        try:
            found = entry.detect(env_map, ctx)
        except ConfigError as exc:
            out.append(Candidate(entry.name, "error", str(exc)))
            continue
        if found is None:
            out.append(Candidate(entry.name, "absent", _absent(entry, env_map)))
        elif found.launcher == chosen:
            why = f"forced by {LAUNCHER_VAR}={forced}" if forced else "first match in precedence"
            out.append(Candidate(found.launcher, "chosen", why))
        else:
            why = f"{LAUNCHER_VAR}={forced}" if forced else f"outranked by {chosen}"
            out.append(Candidate(found.launcher, "outranked", f"variables present, but {why}"))
    return out


def _absent(entry: Launcher, environ: Mapping[str, str]) -> str:
    """Why ``entry`` did not match: its missing variables, or its own reason."""
    own = entry.absent_reason(environ) if entry.absent_reason is not None else None
    if own:
        return own
    missing = [k for k in entry.keys if not k.startswith("-") and k not in environ]
    return f"not set: {', '.join(missing)}" if missing else "its variables are incomplete"
