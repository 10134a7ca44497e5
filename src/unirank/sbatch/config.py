"""``unirank sbatch --config job.toml``: a TOML file of defaults, merged under the flags.

The file's keys are the long names of the options that set the job
(:data:`unirank.sbatch.options.OPTIONS`, the command line's table too), with dashes or
underscores::

    nodes = 2
    ntasks-per-node = 4
    gpus-per-node = 4
    time = "2:00:00"
    requeue = true
    setup = ["module load cuda/12.4", "source ~/venv/bin/activate"]
    env = ["NCCL_DEBUG=WARN", "WANDB_API_KEY"]
    sbatch-arg = ["--exclusive"]

Merge rule (:func:`merge`): a flag given on the command line wins over the file's value; the
lists add up (the file's ``setup`` lines and ``sbatch-arg`` options first, then the flags'), and
``env`` merges by name, a flag's item replacing the file's item for the same name.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from unirank.errors import ConfigError
from unirank.sbatch.options import OPTIONS

__all__ = ["KEYS", "LIST_KEYS", "merge", "read_config", "validate_config"]

#: key (the long option's name, as written in the file) -> (JobSpec field, expected type)
KEYS: dict[str, tuple[str, type]] = {option.key: (option.field, option.kind)
                                     for option in OPTIONS}
#: fields whose values add up instead of being replaced
LIST_KEYS = frozenset(option.field for option in OPTIONS if option.kind is list)


def _typed(key: str, value: Any, kind: type, where: str) -> Any:
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is str and isinstance(value, (str, int)) and not isinstance(value, bool):
        return str(value)
    if kind is bool and isinstance(value, bool):
        return value
    if kind is list and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    wanted = {int: "a whole number", str: "a string", bool: "true or false",
              list: "a list of strings"}[kind]
    raise ConfigError(f"must be {wanted}", variable=f"{where}: {key}", value=str(value),
                      hint=f'e.g. {key} = {"[...]" if kind is list else "..."}')


def validate_config(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The file's table as JobSpec fields; an unknown key or a wrong type is a ConfigError."""
    fields: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = raw_key.replace("_", "-")
        if key == "sbatch-args":
            key = "sbatch-arg"
        if key not in KEYS:
            raise ConfigError("is not an option of unirank sbatch", variable=f"{where}: key",
                              value=raw_key, hint=f"use one of {', '.join(KEYS)}")
        field, kind = KEYS[key]
        fields[field] = _typed(key, value, kind, where)
    return fields


def _toml() -> ModuleType:
    """Python's ``tomllib`` (3.11+), else the ``tomli`` package it came from."""
    try:
        import tomllib
    except ImportError:  # Python 3.9/3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef,import-not-found,unused-ignore]
        except ImportError:
            raise ConfigError("--config needs Python 3.11's tomllib or the tomli package",
                              hint="pip install tomli, or give the options as flags") from None
    return tomllib


def read_config(path: str) -> dict[str, Any]:
    """The JobSpec fields that the TOML file at ``path`` sets."""
    tomllib = _toml()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot be read: {exc.strerror}", variable="--config", value=path,
                          hint="give the path of a TOML file of unirank sbatch options") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"is not valid TOML: {exc}", variable="--config", value=path,
                          hint="write key = value lines, e.g. nodes = 2") from None
    return validate_config(data, path)


def merge(defaults: Mapping[str, Any], flags: Mapping[str, Any]) -> dict[str, Any]:
    """``defaults`` (from the file) under ``flags`` (``None`` = not given): see the module."""
    merged = dict(defaults)
    for field, value in flags.items():
        if value is None:
            continue
        if field in LIST_KEYS:
            merged[field] = tuple(merged.get(field, ())) + tuple(value)
        else:
            merged[field] = value
    return merged
