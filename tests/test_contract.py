"""The environment contract (pure): every UNIRANK_* name lives in contract.py, and its parsers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from unirank import contract
from unirank.contract import (
    PRIVATE_VARIABLES,
    format_seconds,
    parse_seconds,
    resolve_init_timeout,
)
from unirank.errors import ConfigError

SRC = Path(__file__).resolve().parents[1] / "src" / "unirank"
_LITERAL = re.compile(r"""["'](UNIRANK_[A-Z_]+)["']""")


def _defined() -> dict[str, str]:
    """contract's ``*_VAR`` constants, by value."""
    return {value: name for name, value in vars(contract).items()
            if name.endswith("_VAR") and isinstance(value, str)}


def test_every_unirank_variable_is_named_in_the_contract_only() -> None:
    """A UNIRANK_* name spelled as a string anywhere else in src/ is a second home for it."""
    defined = _defined()
    elsewhere = {}
    for path in SRC.rglob("*.py"):
        if path.name == "contract.py":
            continue
        for name in _LITERAL.findall(path.read_text()):
            elsewhere.setdefault(name, []).append(str(path.relative_to(SRC)))
    assert elsewhere == {}
    assert {"UNIRANK_LAUNCHER", "UNIRANK_NO_SRUN", "UNIRANK_SRUN_REEXEC", "UNIRANK_NODE_NAME",
            "UNIRANK_INIT_TIMEOUT"} <= set(defined)


def test_every_contract_name_is_exported_and_unique() -> None:
    defined = _defined()
    assert len(defined) == len([n for n in vars(contract) if n.endswith("_VAR")])
    assert set(defined.values()) <= set(contract.__all__)


def test_private_variables_are_unirank_s_and_keep_the_node_name() -> None:
    """The bootstrap's private variables are removed before the program; the node's name is
    kept, so that the program's own detection names the node as its supervisor did."""
    assert all(name.startswith("UNIRANK_") for name in PRIVATE_VARIABLES)
    assert contract.NODE_NAME_VAR not in PRIVATE_VARIABLES
    assert contract.INIT_TIMEOUT_VAR not in PRIVATE_VARIABLES


@pytest.mark.parametrize(("value", "text"), [(300, "300"), (2.5, "2.5"), (60.0, "60"),
                                             (0.1, "0.1")])
def test_format_seconds_round_trips(value: float, text: str) -> None:
    assert format_seconds(value) == text
    assert parse_seconds(text, "X", allow_zero=True) == value


@pytest.mark.parametrize(("text", "allow_zero", "message"), [
    ("soon", False, "is not a number of seconds"), ("0", False, "more than 0"),
    ("-1", True, "0 or more"), ("inf", False, "finite"), ("nan", True, "finite"),
])
def test_parse_seconds_refuses_naming_the_variable(text: str, allow_zero: bool,
                                                   message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_seconds(text, "--grace-period", allow_zero=allow_zero)
    assert info.value.variable == "--grace-period"
    assert info.value.hint


def test_parse_seconds_allows_zero_only_when_asked() -> None:
    assert parse_seconds(" 0 ", "X", allow_zero=True) == 0


def test_resolve_init_timeout_order_and_errors() -> None:
    assert resolve_init_timeout(None, {}) == contract.DEFAULT_INIT_TIMEOUT
    assert resolve_init_timeout(None, {"UNIRANK_INIT_TIMEOUT": "  "}) == 300
    assert resolve_init_timeout(None, {"UNIRANK_INIT_TIMEOUT": "9"}) == 9
    assert resolve_init_timeout(4, {"UNIRANK_INIT_TIMEOUT": "9"}) == 4
    with pytest.raises(ConfigError) as info:
        resolve_init_timeout(True, {})
    assert info.value.variable == "--init-timeout"
    with pytest.raises(ConfigError) as info:
        resolve_init_timeout("x", {}, option="timeout")
    assert info.value.variable == "timeout"


def test_the_hang_settings_keep_how_they_were_given_into_the_workers() -> None:
    """``ur.launch(hang_timeout=6)``: the keywords travel with the settings (through the
    worker's variables) so that the hang report names ``hang_timeout=``, not ``--hang-timeout``;
    a value read from a variable is named by the variable; ``unirank run``'s options stay
    options in its workers."""
    from unirank.contract import (
        HANG_KEYWORDS,
        HANG_OPTIONS,
        given_as,
        resolve_hang,
        shown_setting,
    )

    keywords = resolve_hang(None, 6, {}, names=HANG_KEYWORDS)
    worker = resolve_hang(None, None, keywords.environ())
    assert worker.names == HANG_KEYWORDS and worker.timeout == 6
    assert shown_setting(worker.names[1], 6) == "hang_timeout=6"
    assert given_as(worker.names[1]) == "hang_timeout="
    options = resolve_hang(None, 6, {})
    assert options.names == HANG_OPTIONS
    assert resolve_hang(None, None, options.environ()).names == HANG_OPTIONS
    assert shown_setting(options.names[1], 6) == "--hang-timeout 6 s"
    exported = resolve_hang(None, None, {"UNIRANK_HANG_TIMEOUT": "6"})
    assert exported.names == ("--hang-report-after", "UNIRANK_HANG_TIMEOUT")
    assert resolve_hang(None, None, exported.environ()).names == exported.names
    assert given_as("UNIRANK_HANG_TIMEOUT") == "UNIRANK_HANG_TIMEOUT"


def test_one_reading_of_every_on_off_variable() -> None:
    from unirank.contract import flag

    assert [flag({"V": v}, "V") for v in ("1", "yes", "true", " 2 ")] == [True] * 4
    assert [flag({"V": v}, "V") for v in ("", "0", " 0 ", "  ")] == [False] * 4
    assert flag({}, "V") is False
    src = (SRC / "contract.py").read_text()
    assert "THE reading of unirank's on/off variables" in src
    others = [p.name for p in SRC.rglob("*.py") if p.name != "contract.py"
              and re.search(r'not in \("", "0"\)|_VAR(?:\)|, "")\)?(?:\.strip\(\))? == "1"',
                            p.read_text())]
    assert others == []
