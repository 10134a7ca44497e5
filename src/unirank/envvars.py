"""Readers of an environment mapping that turn bad values into one-line :class:`ConfigError`,
and the one rule for which variable names hold a secret (:func:`looks_secret`: ``unirank check``
masks their values, ``unirank sbatch`` never writes them into a script).

Reads no environment variable itself: every function takes the mapping or the name.
"""

from __future__ import annotations

from collections.abc import Mapping

from unirank.errors import ConfigError

__all__ = ["SECRET_MARKERS", "check_rank", "first_set", "looks_secret", "read_int",
           "read_optional_int"]

#: a variable whose name holds one of these (any case) is taken for a secret
SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD")


def looks_secret(name: str) -> bool:
    """True when the variable's name holds TOKEN, KEY, SECRET or PASSWORD, in any case."""
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def first_set(environ: Mapping[str, str], *names: str) -> str | None:
    """The first of ``names`` that is set in ``environ`` (may be set to ``""``), or None."""
    for name in names:
        if name in environ:
            return name
    return None


def read_int(
    environ: Mapping[str, str], name: str, *, minimum: int = 0, hint: str | None = None
) -> int:
    """``environ[name]`` as an integer >= ``minimum``.

    Raises ConfigError naming the variable when it is missing, not an integer, or too small.
    """
    raw = environ.get(name)
    if raw is None:
        raise ConfigError(
            "is not set", variable=name, value=None,
            hint=hint or f"the launcher should set {name}; export it or unset the others",
        )
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(
            "is not an integer", variable=name, value=raw,
            hint=hint or f"set {name} to a whole number",
        ) from None
    if value < minimum:
        raise ConfigError(
            f"must be >= {minimum}", variable=name, value=raw,
            hint=hint or f"set {name} to a whole number of at least {minimum}",
        )
    return value


def read_optional_int(
    environ: Mapping[str, str], name: str, *, minimum: int = 0, hint: str | None = None
) -> int | None:
    """Like :func:`read_int`, but None when ``name`` is not set."""
    if name not in environ:
        return None
    return read_int(environ, name, minimum=minimum, hint=hint)


def check_rank(
    rank: int, size: int, *, rank_var: str, size_var: str, rank_value: str | None = None
) -> None:
    """Raise ConfigError unless ``0 <= rank < size``."""
    if rank >= size:
        raise ConfigError(
            f"must be smaller than {size_var}={size}",
            variable=rank_var,
            value=str(rank) if rank_value is None else rank_value,
            hint=f"the launcher's {rank_var} and {size_var} disagree; check how the job was "
            "started (mixed launchers, or variables left over from an outer job?)",
        )
