"""The configuration report of ``unirank check``: pure functions of facts and an environment.

Lines follow the classic ``check_config.py`` (``torch version : X``, ``torch git version : X``, the
CUDA lines or ``no cuda available``, then the Slurm variables and host names inside a Slurm job),
then what unirank adds: the detected launcher with every DistEnv field, and every ``NCCL_*``,
``GLOO_*`` and ``TORCH_*`` variable, masked when its name suggests a secret.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from unirank.distenv import DistEnv
from unirank.envvars import looks_secret
from unirank.errors import ConfigError
from unirank.launchers import slurm_vars as V

__all__ = [
    "MASK",
    "SLURM_VARIABLES",
    "VARIABLE_PREFIXES",
    "TorchFacts",
    "build_report",
    "format_report",
    "masked",
]

#: the Slurm variables the report shows, in its order
SLURM_VARIABLES = (V.PROCID, V.LOCALID, V.JOB_NUM_TASKS[0], V.JOB_NODELIST[0])
VARIABLE_PREFIXES = ("NCCL_", "GLOO_", "TORCH_")
MASK = "****"
_UNSET = "<unset>"


@dataclass(frozen=True)
class TorchFacts:
    """What torch says about itself and CUDA (``devices``: one property string per GPU)."""

    version: str
    git_version: str
    cuda_available: bool
    cuda_version: str | None
    devices: tuple[str, ...] = ()


def masked(name: str, value: str) -> str:
    """``value``, or :data:`MASK` when ``name`` looks like a secret's
    (:func:`unirank.envvars.looks_secret`)."""
    return MASK if looks_secret(name) else value


def _slurm_section(environ: Mapping[str, str]) -> dict[str, Any] | None:
    """Reads: SLURM_JOBID, SLURM_JOB_ID, SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS,
    SLURM_JOB_NODELIST."""
    if V.job_id(environ)[0] is None:
        return None
    from unirank.hostlist import expand

    section: dict[str, Any] = {name: environ.get(name) for name in SLURM_VARIABLES}
    nodelist = environ.get(V.JOB_NODELIST[0])
    section["hostnames"] = None
    section["hostnames_error"] = None
    if nodelist is not None:
        try:
            section["hostnames"] = expand(nodelist, variable=V.JOB_NODELIST[0])
        except ConfigError as exc:
            section["hostnames_error"] = str(exc)
    return section


def build_report(
    facts: TorchFacts,
    environ: Mapping[str, str],
    env: DistEnv | None,
    detect_error: str | None = None,
) -> dict[str, Any]:
    """The report as a JSON-ready dict.

    ``env`` is the detected DistEnv, or ``None`` with ``detect_error`` saying why detection
    failed. Reads (from ``environ``): the Slurm variables above and every NCCL_*/GLOO_*/TORCH_*.
    """
    variables = {
        name: masked(name, environ[name])
        for name in sorted(environ)
        if name.startswith(VARIABLE_PREFIXES)
    }
    return {
        "torch": {"version": facts.version, "git_version": facts.git_version},
        "cuda": {
            "available": facts.cuda_available,
            "version": facts.cuda_version,
            "device_count": len(facts.devices),
            "devices": list(facts.devices),
        },
        "slurm": _slurm_section(environ),
        "launcher": env.launcher if env is not None else None,
        "dist_env": _env_fields(env) if env is not None else None,
        "detect_error": detect_error,
        "variables": variables,
    }


def _env_fields(env: DistEnv) -> dict[str, Any]:
    fields = env.to_dict()
    fields.pop("sources", None)
    return fields


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) if value else "-"
    return str(value)


def _torch_lines(report: Mapping[str, Any]) -> list[str]:
    torch_part, cuda = report["torch"], report["cuda"]
    lines = [
        f"torch version : {torch_part['version']}",
        f"torch git version : {torch_part['git_version']}",
    ]
    if cuda["available"]:
        lines.append(f"torch version cuda : {cuda['version']}")
        lines.append(f"number of cuda device(s) : {cuda['device_count']}")
        lines.extend(f"- device {i} : {props}" for i, props in enumerate(cuda["devices"]))
    else:
        lines.append("no cuda available")
    return lines


def _slurm_lines(slurm: Mapping[str, Any] | None) -> list[str]:
    if slurm is None:
        return []
    lines = [
        f"{name} : {_UNSET if slurm[name] is None else slurm[name]}" for name in SLURM_VARIABLES
    ]
    if slurm["hostnames_error"]:
        lines.append(f"hostnames : error: {slurm['hostnames_error']}")
    elif slurm["hostnames"] is not None:
        lines.append(f"hostnames : {' '.join(slurm['hostnames'])}")
    return lines


def _unirank_lines(report: Mapping[str, Any]) -> list[str]:
    if report["dist_env"] is None:
        return [f"launcher : error: {report['detect_error']}"]
    lines = [f"launcher : {report['launcher']}"]
    lines.extend(
        f"{name} : {_show(value)}"
        for name, value in report["dist_env"].items()
        if name != "launcher"
    )
    return lines


def _variable_lines(variables: Mapping[str, str]) -> list[str]:
    if not variables:
        return [f"no {'/'.join(p + '*' for p in VARIABLE_PREFIXES)} variables set"]
    return [f"{name} : {value}" for name, value in variables.items()]


def format_report(report: Mapping[str, Any]) -> Sequence[str]:
    """The report's lines, the classic ones first, then unirank's additions."""
    return [
        *_torch_lines(report),
        *_slurm_lines(report["slurm"]),
        *_unirank_lines(report),
        *_variable_lines(report["variables"]),
    ]
