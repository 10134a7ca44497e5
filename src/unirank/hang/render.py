"""The hang report's text (pure): the wavefront, mismatches, and every rank's Python stack
grouped by identical stack. Golden files in tests/fixtures/hang.

Reads no environment variable.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from unirank.contract import HANG_OPTIONS, given_as, shown_setting
from unirank.hang.detect import Ahead, Call, Hang, Laggard, Uneven
from unirank.joincheck import format_ranks

__all__ = [
    "UNEVEN_HEAD",
    "changed_ranks",
    "mismatch_line",
    "progress_line",
    "render_report",
    "render_snapshot",
    "stack_groups",
    "timeout_message",
    "uneven_ended",
    "uneven_line",
    "wavefront_line",
]

INDENT = "  "
#: how :func:`uneven_line` begins
UNEVEN_HEAD = "the ranks ran different numbers of collectives"


def _seconds(value: float) -> str:
    return f"{math.floor(value)} s"


def _who(ranks: Sequence[int], nodes: Mapping[int, str]) -> str:
    """``rank 7 (node2)``, ``ranks 0-6`` (several nodes: not named)."""
    names = sorted({nodes.get(r, "") for r in ranks} - {""})
    text = format_ranks(ranks)
    return f"{text} ({', '.join(names)})" if names and len(names) <= 2 else text


def _call(call: Call, *, verb: str = "") -> str:
    details = ", ".join(x for x in (call.what, call.site) if x)
    return f"{verb}{call.op} #{call.seq}" + (f" ({details})" if details else "")


def _laggard(lag: Laggard, nodes: Mapping[int, str], several: bool) -> str:
    own = f"rank {lag.rank}'s" if several else "its"
    if lag.silent_for is None:
        return f"rank {lag.rank} sent no progress record (not started, or frozen)"
    if lag.finished:
        return f"{own} program has ended"
    if lag.where:
        return f"{own} main thread is in {lag.where}"
    return f"{own} main thread is outside the program's code"


def _ahead(ahead: Ahead, several: bool) -> str:
    own = f"rank {ahead.rank}" if several else "it"
    if ahead.now is not None:
        return f"{own} waits in {_call(ahead.now)} since {_seconds(ahead.now.waited or 0.0)}"
    if ahead.finished:
        return f"{own} ended its program after collective #{ahead.last}"
    if ahead.where:
        return f"{own} is in {ahead.where} (its last collective: #{ahead.last})"
    return f"{own} computes (its last collective: #{ahead.last})"


def wavefront_line(hang: Hang) -> str:
    """"ranks 0-6 wait in all_reduce #1025 (float32[1024], train.py:57) since 61 s; rank 7
    (node2) has not entered it: its main thread is in save_checkpoint (train.py:80)"; ranks
    that left the collective: "rank 1 has left it: it waits in barrier #5 since 6 s"."""
    waits = "; ".join(f"{_who(c.ranks, hang.nodes)} wait{'s' if len(c.ranks) == 1 else ''} "
                      f"in {_call(c)} since {_seconds(c.waited or 0.0)}" for c in hang.waiting)
    parts = [waits]
    if hang.laggards:
        lagging = [lag.rank for lag in hang.laggards]
        several = len(lagging) > 1
        verb = "have" if several else "has"
        where = ", ".join(_laggard(lag, hang.nodes, several) for lag in hang.laggards)
        parts.append(f"{_who(lagging, hang.nodes)} {verb} not entered it: {where}")
    if hang.ahead:
        went = [a.rank for a in hang.ahead]
        several = len(went) > 1
        where = ", ".join(_ahead(a, several) for a in hang.ahead)
        parts.append(f"{_who(went, hang.nodes)} {'have' if several else 'has'} left it: {where}")
    return "; ".join(parts)


def mismatch_line(hang: Hang) -> str:
    """"rank 3 (node1) called broadcast #12 (train.py:60), ranks 0-2 (node1) all_reduce #12
    (float32[1024], train.py:57)": the odd calls first, then the others'; "" for none."""
    if not hang.mismatched:
        return ""
    parts = []
    for index, call in enumerate((*hang.mismatched, *hang.matched)):
        verb = "called " if index == 0 else ""
        parts.append(f"{_who(call.ranks, hang.nodes)} {_call(call, verb=verb)}")
    return ", ".join(parts)


def timeout_message(hangs: Sequence[Hang], limit: float, name: str = HANG_OPTIONS[1]) -> str:
    """The one line every rank records when ``--hang-timeout`` ends the job (the failure
    summary's ``error:`` line): the first hang's mismatch, then its wavefront; ``name``: how
    the timeout was given (:attr:`unirank.contract.HangSettings.names`)."""
    hang = hangs[0]
    mismatch = mismatch_line(hang)
    return (f"no progress for {limit:g} s ({given_as(name)}): "
            + (f"mismatch: {mismatch}; " if mismatch else "") + wavefront_line(hang))


def uneven_line(uneven: Uneven) -> str:
    """"the ranks ran different numbers of collectives: rank 1 ended its program after
    collective #2, rank 0 called all_reduce #3 (train.py:9)"."""
    ended = ", ".join(f"rank {r} ended its program after collective #{n}"
                      for r, n in uneven.ended)
    text = (f"{UNEVEN_HEAD}: {ended}, rank "
            f"{uneven.call.ranks[0]} called {_call(uneven.call)}")
    if len(uneven.mismatch) > 1:
        first, *others = uneven.mismatch
        text += "; they first differ at " + ", ".join(
            f"{format_ranks(c.ranks)} {_call(c)}" for c in (*others, first))
    return text


_ENDED = re.compile(r"rank (\d+) ended its program after collective #(\d+)")


def uneven_ended(error: str) -> dict[int, int]:
    """The ranks an :func:`uneven_line` in ``error`` says ended their program, with the
    number of collectives each ran (``{1: 2}``); ``{}`` for any other error."""
    head = error.find(UNEVEN_HEAD)
    if head < 0:
        return {}
    ended = error[head:].split(" called ", 1)[0]  # the ended ranks come before the caller
    return {int(rank): int(count) for rank, count in _ENDED.findall(ended)}


def stack_groups(stacks: Mapping[int, Sequence[Mapping[str, Any]]]) -> list[
        tuple[list[int], Sequence[Mapping[str, Any]]]]:
    """Ranks with identical stacks (every thread's name and frames), the largest group first."""
    groups: dict[Any, list[int]] = {}
    first: dict[Any, Sequence[Mapping[str, Any]]] = {}
    for rank, threads in sorted(stacks.items()):
        key = tuple((t["name"], tuple(tuple(f) for f in t["frames"])) for t in threads)
        groups.setdefault(key, []).append(rank)
        first.setdefault(key, threads)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1]))
    return [(ranks, first[key]) for key, ranks in ordered]


def _stack_lines(threads: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = []
    for thread in threads:
        lines.append(f"{INDENT * 2}Thread {thread['name']}:")
        for path, line, function, source in thread["frames"]:
            lines.append(f'{INDENT * 3}File "{path}", line {line}, in {function}')
            if source:
                lines.append(f"{INDENT * 4}{source}")
    return lines


def _stack_section(stacks: Mapping[int, Sequence[Mapping[str, Any]]], nodes: Mapping[int, str],
                   unanswered: Sequence[int], answer_timeout: float) -> list[str]:
    """Every rank's stacks grouped by identical stack, then the ranks that did not answer."""
    out = [f"{INDENT}Python stacks, grouped by identical stack:"]
    for ranks, threads in stack_groups(stacks):
        out.append(f"{INDENT}{_who(ranks, nodes)}:")
        out.extend(_stack_lines(threads))
    if unanswered:
        out.append(f"{INDENT}{_who(unanswered, nodes)}: no stack within "
                   f"{_seconds(answer_timeout)} (frozen, or its interpreter is held)")
    return out


def changed_ranks(before: Mapping[int, Sequence[Mapping[str, Any]]],
                  now: Mapping[int, Sequence[Mapping[str, Any]]]) -> list[int]:
    """The ranks whose stacks (any thread's) differ between two reports, or that answered in
    one only."""
    def key(threads: Sequence[Mapping[str, Any]] | None) -> Any:
        return None if threads is None else tuple(
            (t["name"], tuple(tuple(f) for f in t["frames"])) for t in threads)

    return sorted(r for r in set(before) | set(now) if key(before.get(r)) != key(now.get(r)))


def render_report(hangs: Sequence[Hang], stacks: Mapping[int, Sequence[Mapping[str, Any]]],
                  *, unanswered: Sequence[int], number: int, report_after: float,
                  nodes: Mapping[int, str], answer_timeout: float,
                  dump_files: Sequence[str] = (), ending: str = "", cause: str = "",
                  since: tuple[int, Sequence[int]] | None = None,
                  after_name: str = HANG_OPTIONS[0]) -> str:
    """The whole report (see the module docstring); ``number``: the how-manieth for this hang,
    ``unanswered``: ranks whose stacks did not come within ``answer_timeout`` seconds,
    ``dump_files``: where the full dump went, ``ending``: a last line (``--hang-timeout``);
    ``cause``: the report is made at the job's stop (``on SIGINT``, ``at the collective's
    timeout``), not after ``report_after`` seconds; ``since``: a short report (the same
    hang as report ``since[0]``, whose stacks it showed): which ranks' stacks changed since,
    not the stacks; ``after_name``: how ``report_after`` was given
    (:attr:`unirank.contract.HangSettings.names`)."""
    longest = max((h.waited for h in hangs), default=0.0)
    head = (f"({cause})" if cause else f"(report {number})")
    tail = "" if cause else f" ({shown_setting(after_name, report_after)})"
    out = [f"unirank: HANG {head}: ranks have waited in a collective for "
           f"{_seconds(longest)}{tail}"]
    for hang in hangs:
        prefix = "" if hang.pg == "0" else f"process group {hang.pg}: "
        if hang.laggards or hang.ahead or not hang.mismatched:
            out.append(f"{INDENT}{prefix}{wavefront_line(hang)}")
        if hang.mismatched:
            out.append(f"{INDENT}{prefix}mismatch: {mismatch_line(hang)}")
    if since is None:
        out += _stack_section(stacks, nodes, unanswered, answer_timeout)
    else:
        first, changed = since
        out.append(f"{INDENT}Python stacks: " + (
            f"{_who(changed, nodes)}'s changed since report {first}" if changed
            else f"as in report {first}"))
        if unanswered:
            out.append(f"{INDENT}{_who(unanswered, nodes)}: no stack within "
                       f"{_seconds(answer_timeout)} (frozen, or its interpreter is held)")
    if dump_files:
        out.append(f"{INDENT}every rank's stack: {', '.join(dump_files)}")
    if ending:
        out.append(f"{INDENT}{ending}")
    return "\n".join(out) + "\n"


def progress_line(record: Mapping[str, Any] | None, now: float) -> str:
    """One rank's progress in words: each group's last collective (waiting or finished) and
    where its main thread is."""
    if record is None:
        return "no progress record yet"
    parts = []
    for group in record.get("groups", ()):
        prefix = "" if group["pg"] == "0" else f"group {group['pg']}: "
        call = Call((), group.get("op") or "collective", group["entered"], group.get("what", ""),
                    group.get("site", ""))
        if group["entered"] > group["done"] and group.get("since") is not None:
            waited = max(0.0, now - float(group["since"]))
            parts.append(f"{prefix}waiting in {_call(call)} for {_seconds(waited)}")
        else:
            parts.append(f"{prefix}finished collective #{group['done']}")
    if record.get("finished"):
        parts.append("its program has ended")
    elif record.get("where"):
        parts.append(f"main thread in {record['where']}")
    return "; ".join(parts) or "no collective yet"


def render_snapshot(records: Mapping[int, Mapping[str, Any] | None],
                    stacks: Mapping[int, Sequence[Mapping[str, Any]]], *, job: str,
                    unanswered: Sequence[int], nodes: Mapping[int, str], now: float,
                    answer_timeout: float) -> str:
    """``unirank stacks``: every rank's progress (ranks with the same words together), then
    the stacks grouped as in the hang report."""
    out = [f"unirank stacks: job {job}, {len(records)} ranks"]
    lines: dict[str, list[int]] = {}
    for rank, record in sorted(records.items()):
        lines.setdefault(progress_line(record, now), []).append(rank)
    for text, ranks in lines.items():
        out.append(f"{INDENT}{_who(ranks, nodes)}: {text}")
    out += _stack_section(stacks, nodes, unanswered, answer_timeout)
    return "\n".join(out) + "\n"
