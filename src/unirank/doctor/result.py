"""One doctor row (:class:`Check`), the merge of every rank's rows, and the table and JSON.

No torch, no environment: pure functions.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "FAIL",
    "OK",
    "SKIP",
    "WARN",
    "Check",
    "emit",
    "failed",
    "format_table",
    "merge",
    "to_json",
]

OK = "OK"
WARN = "WARN"
FAIL = "FAIL"
#: not run, because a failure above makes it pointless (the detail names that row)
SKIP = "SKIP"
_ORDER = {OK: 0, SKIP: 1, WARN: 2, FAIL: 3}


@dataclass(frozen=True)
class Check:
    """One check's verdict: ``status`` is OK, WARN, FAIL or SKIP; ``hint`` the exact variable or
    option to set (empty when there is nothing to do)."""

    name: str
    status: str
    detail: str
    hint: str = ""


def failed(checks: Iterable[Check]) -> bool:
    """True when any check failed."""
    return any(check.status == FAIL for check in checks)


def merge(per_rank: Sequence[tuple[str, Sequence[Check]]]) -> list[Check]:
    """One row per check name from every rank's rows (``per_rank``: ``(who, rows)``, ``who`` as
    ``rank R (node)``): the worst status; when not every rank is OK, the detail of each rank that
    is not, named; when every rank is OK, rank 0's row."""
    names: list[str] = []
    rows: dict[str, list[tuple[str, Check]]] = {}
    for who, checks in per_rank:
        for check in checks:
            if check.name not in rows:
                names.append(check.name)
            rows.setdefault(check.name, []).append((who, check))
    merged: list[Check] = []
    for name in names:
        entries = rows[name]
        worst = max((c.status for _, c in entries), key=_ORDER.__getitem__)
        bad = [(who, c) for who, c in entries if c.status != OK]
        if not bad or len(per_rank) == 1:
            merged.append(bad[0][1] if bad else entries[0][1])
            continue
        same: dict[tuple[str, str], list[str]] = {}
        for who, c in bad:
            same.setdefault((c.status, c.detail), []).append(who)
        detail = "; ".join(f"{', '.join(whos)}: {status} {text}"
                           for (status, text), whos in same.items())
        hint = next((c.hint for _, c in bad if c.status == worst and c.hint), "")
        merged.append(Check(name, worst, detail, hint))
    return merged


def format_table(checks: Sequence[Check], header: Sequence[str] = ()) -> str:
    """The table: ``header`` lines, then one line per check (name, status, detail) and, below a
    row with something to do, ``HINT: ...``; last, the verdict line."""
    width = max([len(c.name) for c in checks] + [5])
    lines = list(header)
    lines.append(f"{'check':<{width}}  {'status':<6}  detail")
    for check in checks:
        lines.append(f"{check.name:<{width}}  {check.status:<6}  {check.detail}")
        if check.hint and check.status != OK:
            lines.append(f"{'':<{width}}  {'':<6}  HINT: {check.hint}")
    counts = {s: sum(c.status == s for c in checks) for s in (OK, WARN, FAIL, SKIP)}
    verdict = "FAILED" if counts[FAIL] else "passed"
    skipped = f", {counts[SKIP]} SKIP" if counts[SKIP] else ""
    lines.append(f"doctor {verdict}: {counts[OK]} OK, {counts[WARN]} WARN, {counts[FAIL]} FAIL"
                 + skipped)
    return "\n".join(lines)


def to_json(checks: Sequence[Check], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON object ``--json`` prints: ``ok`` (nothing failed), ``checks`` and ``extra``."""
    return {**(extra or {}), "ok": not failed(checks), "checks": [asdict(c) for c in checks]}


def emit(rows: Sequence[Check], header: Sequence[str], as_json: bool) -> int:
    """Print the table (or JSON) on stdout; the exit code (1 when a row failed)."""
    if as_json:
        print(json.dumps(to_json(rows, {"header": list(header)}), indent=2), flush=True)
    else:
        print(format_table(rows, header), flush=True)
    return 1 if failed(rows) else 0
