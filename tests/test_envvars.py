"""Readers of an environment mapping (pure): every bad value is one ConfigError naming it; and
the one rule for secret-looking names, which ``unirank check`` and ``unirank sbatch`` share."""

from __future__ import annotations

from pathlib import Path

import pytest

from unirank.envvars import (
    SECRET_MARKERS,
    check_rank,
    first_set,
    looks_secret,
    read_int,
    read_optional_int,
)
from unirank.errors import ConfigError

SRC = Path(__file__).resolve().parents[1] / "src" / "unirank"


def test_first_set_takes_the_first_present_even_if_empty() -> None:
    environ = {"B": "", "C": "3"}
    assert first_set(environ, "A", "B", "C") == "B"
    assert first_set(environ, "C", "B") == "C"
    assert first_set(environ, "A") is None
    assert first_set(environ) is None


@pytest.mark.parametrize(("raw", "minimum", "expected"), [("4", 0, 4), (" 7 ", 1, 7),
                                                          ("0", 0, 0), ("-2", -5, -2)])
def test_read_int(raw: str, minimum: int, expected: int) -> None:
    assert read_int({"N": raw}, "N", minimum=minimum) == expected


@pytest.mark.parametrize(("environ", "minimum", "message", "value"), [
    ({}, 0, "is not set", "<unset>"),
    ({"N": "two"}, 0, "is not an integer", "'two'"),
    ({"N": ""}, 0, "is not an integer", "''"),
    ({"N": "1.5"}, 0, "is not an integer", "'1.5'"),
    ({"N": "0"}, 1, "must be >= 1", "'0'"),
])
def test_read_int_errors_name_the_variable_and_its_value(environ: dict[str, str], minimum: int,
                                                         message: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        read_int(environ, "N", minimum=minimum)
    text = str(info.value)
    assert info.value.variable == "N"
    assert text.startswith(f"N={value}: {message}")
    assert "\n" not in text and "HINT:" in text


def test_read_int_uses_the_given_hint() -> None:
    with pytest.raises(ConfigError) as info:
        read_int({}, "RANK", hint="torchrun sets RANK")
    assert info.value.hint == "torchrun sets RANK"


def test_read_optional_int() -> None:
    assert read_optional_int({}, "N") is None
    assert read_optional_int({"N": "3"}, "N", minimum=1) == 3
    with pytest.raises(ConfigError, match="must be >= 1"):
        read_optional_int({"N": "0"}, "N", minimum=1)


def test_check_rank() -> None:
    check_rank(0, 1, rank_var="R", size_var="S")
    check_rank(3, 4, rank_var="R", size_var="S")
    with pytest.raises(ConfigError) as info:
        check_rank(4, 4, rank_var="R", size_var="S")
    assert info.value.variable == "R"
    assert str(info.value).startswith("R='4': must be smaller than S=4")
    with pytest.raises(ConfigError) as info:
        check_rank(5, 2, rank_var="R", size_var="S", rank_value=" 5")
    assert info.value.value == " 5"


@pytest.mark.parametrize("name", ["HF_TOKEN", "wandb_api_key", "MY_SECRET_X", "DB_PASSWORD",
                                  "KEYRING_PATH", "NCCL_DEBUG", "TOKENIZERS_PARALLELISM_X",
                                  "PASSWD", "OMP_NUM_THREADS"])
def test_check_masks_what_sbatch_refuses_to_write(name: str) -> None:
    """``unirank check`` masks a value exactly when ``unirank sbatch --env NAME=VALUE`` refuses
    to write it into a script: both ask :func:`looks_secret`."""
    from unirank.report import MASK, masked
    from unirank.sbatch.spec import parse_env

    try:
        parse_env((f"{name}=v",))
        refused = False
    except ConfigError as exc:
        assert "looks secret" in str(exc) and "=v" not in str(exc)
        refused = True
    assert (masked(name, "v") == MASK) is refused is looks_secret(name)


def test_the_secret_markers_are_spelled_in_envvars_only() -> None:
    """A second list of markers in src/ would be a second rule that could drift from this one."""
    spelled = sorted(str(path.relative_to(SRC)) for path in SRC.rglob("*.py")
                     if any(f'"{marker}"' in path.read_text() for marker in SECRET_MARKERS))
    assert spelled == ["envvars.py"]
