"""The sample lines the docs show are the lines the code prints: golden checks of the docs.

Each :class:`Sample` is one kind of line the code prints, rendered by the real function (here the
supervisor's stop policy, :mod:`unirank.supervisor.stoppolicy`, with the engine's prefix). Its
*parts* are what a doc may choose (a node's name, which rank failed, a count); its *settings*
(the grace period) always take the code's defaults, as a doc's sample shows a run without
options. Rendering it with a marker for every part and setting gives the line's shape; every
line of a fenced code block in README.md and docs/*.md (leading blanks dropped) that has the
shape's longest fixed text is a sample of it: it must have the whole shape, and equal the line
the code renders from that doc line's parts with the default settings. So a changed default or
wording fails here until the docs show it.

To check a new kind of line, add a :class:`Sample` to :data:`SAMPLES`. Reads no environment
variable (the defaults come from :func:`unirank.cli.runconfig.grace_period` given none).
"""

from __future__ import annotations

import inspect
import re
import signal
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from test_docs import _FENCE, PAGES, ROOT
from unirank.cli.runconfig import grace_period
from unirank.supervisor import stoppolicy
from unirank.supervisor.engine import KILL_WAIT, Supervisor

#: the prefix of the engine's own lines (``Supervisor``'s default ``prog``)
PROG: str = inspect.signature(Supervisor).parameters["prog"].default
#: the settings the docs' samples show: the code's defaults (no option, no variable)
DEFAULTS: Mapping[str, Any] = {"grace": grace_period(None, {})}
#: a value of each setting that marks where it goes in a line's shape
_SETTING_MARKS: Mapping[str, Any] = {"grace": 424242.0}


@dataclass(frozen=True)
class Sample:
    """One kind of line the code prints: ``render(**parts, **settings)`` returns it."""

    name: str
    render: Callable[..., str]
    #: what a doc may choose, each with a value that marks where it goes in the line (a
    #: string, or a number where the code takes one; a part written more than once must be
    #: the same each time)
    parts: Mapping[str, Any]
    #: the settings the line shows (each rendered at its default)
    settings: tuple[str, ...] = ("grace",)

    def shape(self) -> re.Pattern[str]:
        """The line with any parts and settings: a named group each."""
        marks = {**self.parts, **{k: v for k, v in _SETTING_MARKS.items()
                                  if k in DEFAULTS and k in self.settings}}
        pattern = re.escape(self.render(**marks))
        for name, mark in marks.items():
            text = re.escape(f"{mark:g}" if isinstance(mark, float) else str(mark))
            assert text in pattern, f"{self.name}: {name} is not in the line"
            pattern = pattern.replace(text, f"(?P<{name}>.+?)", 1).replace(text, f"(?P={name})")
            if isinstance(mark, int):  # "1 worker", "3 workers" (words.counted)
                pattern = re.sub(rf"(\(\?P<{name}>\.\+\?\)\\ \w+?)s\b", r"\1s?", pattern)
        return re.compile(pattern)

    def fixed(self) -> str:
        """The shape's longest text that no part or setting changes (how a sample is found)."""
        pieces = re.split(r"\(\?P[^)]*\)|\w+s\?", self.shape().pattern)
        return max(pieces, key=len).replace("\\", "")

    def printed(self, line: str) -> str | None:
        """What the code prints with ``line``'s parts and the default settings (None: the
        line does not have the shape)."""
        match = self.shape().fullmatch(line)
        if match is None:
            return None
        parts = {k: int(v) if isinstance(self.parts[k], int) and v.isdigit() else v
                 for k, v in match.groupdict().items() if k in self.parts}
        return self.render(**parts, **{k: v for k, v in DEFAULTS.items() if k in self.settings})


def _rules(grace: float) -> stoppolicy.StopRules:
    return stoppolicy.StopRules(grace_period=grace, kill_wait=KILL_WAIT,
                                signals=(signal.SIGINT, signal.SIGTERM))


def _first_failure(who: str, others: int, grace: float) -> str:
    action = stoppolicy.on_first_failure(stoppolicy.StopState(), others=others,
                                         config_error=False, who=who, rules=_rules(grace),
                                         now=0.0)
    return f"{PROG}: {action.say}"


def _world_change(change: str, grace: float) -> str:
    action = stoppolicy.on_world_change(stoppolicy.StopState(), change, alive=True,
                                        rules=_rules(grace), now=0.0)
    return f"{PROG}: {action.say}"


def _node_gone(change: str, grace: float) -> str:
    action = stoppolicy.on_world_change(stoppolicy.StopState(), change, alive=True,
                                        rules=_rules(grace), now=0.0, node_gone=True)
    return f"{PROG}: {action.say}"


def _stop_signal(name: str, grace: float) -> str:
    action = stoppolicy.on_signal(stoppolicy.StopState(), signal.Signals[name], _rules(grace),
                                  now=0.0)
    return f"{PROG}: {action.say}"


def _stop_on_no_return(name: str, grace: float) -> str:
    """A stop signal after a hang report of collectives that cannot return."""
    asked = stoppolicy.on_signal(stoppolicy.StopState(), signal.Signals[name], _rules(grace),
                                 now=0.0, report_wanted=lambda: True).state
    action = stoppolicy.on_report_end(asked, _rules(grace), now=0.0, cannot_return=True)
    return f"{PROG}: {action.say}"


def _nothing_to_evict(rank: int) -> str:
    """A mismatch's hang under ``--on-hang evict``: ``rank`` called another collective."""
    from unirank.hang.detect import MISMATCH
    from unirank.supervisor.restartreason import nothing_to_evict

    verdict = {"never_entered": [], "call": "all_reduce #2", "blamed": [rank],
               "blame": MISMATCH}
    return f"{PROG}: {nothing_to_evict(verdict)}"


SAMPLES = (
    Sample("first failure", _first_failure, {"who": "\x00who\x00", "others": 919191}),
    Sample("change of the world", _world_change, {"change": "\x00change\x00"}),
    Sample("a node gone", _node_gone, {"change": "\x00change\x00"}),
    Sample("stop signal", _stop_signal, {"name": "SIGINT"}),
    Sample("stop signal, no return", _stop_on_no_return, {"name": "SIGINT"}),
    Sample("nothing to evict", _nothing_to_evict, {"rank": 929292}, settings=()),
)


def code_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line without its leading blanks) of every line in a fenced code block."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
        elif fenced:
            yield number, line.strip()


def wrong_samples(text: str, samples: tuple[Sample, ...] = SAMPLES) -> list[str]:
    """Each code line of ``text`` that has a sample's fixed text but is not a line the code
    prints: ``line N (kind): shown / printed``, or ``is not its shape`` where it has the shape
    of no kind whose fixed text it holds (kinds may share a fixed text)."""
    wrong: list[str] = []
    for number, line in code_lines(text):  # a line may be indented (a block in a list)
        candidates = [sample for sample in samples if sample.fixed() in line]
        printed = [(sample, sample.printed(line)) for sample in candidates]
        shaped = [(sample, out) for sample, out in printed if out is not None]
        if not candidates or any(out == line for _, out in shaped):
            continue
        if shaped:
            sample, out = shaped[0]
            wrong.append(f"line {number} ({sample.name}): shown {line!r}, printed {out!r}")
        else:
            names = ", ".join(sample.name for sample in candidates)
            shapes = " or ".join(repr(sample.shape().pattern) for sample in candidates)
            wrong.append(f"line {number} ({names}): {line!r} is not its shape {shapes}")
    return wrong


def test_a_stale_sample_is_found() -> None:
    grace = f"{DEFAULTS['grace']:g}"
    text = ("prose: SIGKILL after 5 s\n```\n"
            "  unirank run: node a is lost; stopping the workers: SIGTERM now, SIGKILL after 5 s\n"
            f"unirank run: node a is lost; stopping the workers: SIGTERM now, SIGKILL after "
            f"{grace} s\n"
            "unirank run: rank 1 ended; stopping the other 3 workers: SIGTERM now, SIGKILL "
            f"after {grace} s\n"
            "unirank run: got SIGTERM: forwarded to the workers; SIGKILL in 1 s (SIGTERM again "
            "to kill now)\n"
            "unirank run: got SIGINT: forwarded to the workers; SIGKILL in "
            f"{grace} s (SIGINT again to kill now)\n"
            "[rank0]: x; stopping the workers: SIGTERM now, SIGKILL after a while\n```\n")
    wrong = wrong_samples(text)
    assert [w.split(" (", 1)[0] for w in wrong] == ["line 3", "line 6", "line 8"], wrong
    assert f"SIGKILL after {grace} s'" in wrong[0]
    assert "is not its shape" in wrong[2]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_sample_lines_are_what_the_code_prints(page: Path) -> None:
    wrong = wrong_samples(page.read_text(encoding="utf-8"))
    assert not wrong, f"{page.relative_to(ROOT)}:\n" + "\n".join(wrong)
