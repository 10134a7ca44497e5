"""Every exit code with a meaning has one home (:mod:`unirank.exitcodes`), and every user takes
it from there (issue 33: 79 lived in sbatch/requeue.py and was imported by the engine, the
summary, the error file and the runtime; 86 in hang/; 130, 143 and 2 were written out), and
the docs' table of them says the same (issue 40: an evicted node exited 2, a refusal's code)."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from unirank import exitcodes
from unirank.exitcodes import (
    EVICTED,
    HANG_TIMEOUT,
    INTERRUPTED,
    MEANINGS,
    REQUEUE,
    TERMINATED,
    USAGE,
    killed_by,
)
from unirank.supervisor.summary import exit_code_of

SRC = Path(__file__).resolve().parents[1] / "src" / "unirank"
#: a meaningful code written out as a number, or a signal's exit code computed by hand
WRITTEN_OUT = re.compile(r"(?:SystemExit|exit)\((?:2|79|86|87|130|143)\)"
                         r"|return (?:2|79|86|87|130|143)\b(?! \*)"  # not ``return 2 * x``
                         r"|\b128 [+-] (?!N\b|signal\b)")


def test_the_codes_and_what_they_mean() -> None:
    assert (USAGE, REQUEUE, HANG_TIMEOUT, EVICTED, INTERRUPTED, TERMINATED) == (
        2, 79, 86, 87, 130, 143)
    assert set(MEANINGS) == {2, 79, 86, 87, 130, 143}
    assert killed_by(signal.SIGINT) == INTERRUPTED and killed_by(signal.SIGTERM) == TERMINATED
    assert exit_code_of(-int(signal.SIGKILL)) == 137 and exit_code_of(79) == REQUEUE


def test_no_module_writes_a_meaningful_code_out() -> None:
    found = [f"{path.relative_to(SRC)}:{number}: {line.strip()}"
             for path in SRC.rglob("*.py") if path.name != "exitcodes.py"
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if WRITTEN_OUT.search(line.split("#")[0]) and '"""' not in line
             and not line.strip().startswith(("``", ":", "(", "the", "line"))]
    assert found == []


def test_exitcodes_imports_nothing_of_unirank() -> None:
    text = Path(exitcodes.__file__).read_text()
    assert "from unirank" not in text and "import unirank" not in text


def test_the_docs_table_lists_every_code_with_its_name() -> None:
    """docs/run.md's table of unirank's own exit codes: one row per code of
    :data:`~unirank.exitcodes.MEANINGS`, named as in :mod:`unirank.exitcodes`."""
    text = (SRC.parents[1] / "docs" / "run.md").read_text(encoding="utf-8")
    table = text.split("| code | name | means |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \|", table, re.M)
    names = {code: name for name in exitcodes.__all__
             if isinstance(code := getattr(exitcodes, name), int)}
    assert [(int(code), name) for code, name in rows] == sorted(names.items())


def test_a_refusal_keeps_its_own_exit_code_through_renaming() -> None:
    from unirank.errors import ConfigError

    error = ConfigError("node evicted: rank 1 never entered all_reduce #6", variable="x",
                        exit_code=EVICTED)
    assert error.renamed({"x": "--y"}).exit_code == EVICTED
    assert ConfigError("bad").exit_code is None
