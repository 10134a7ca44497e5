"""The hang detector's waits have one home (:mod:`unirank.hang.timings`): every user takes them
from there, and the docs' sentences and examples that state them agree with it (issue 40: the
stacks' wait was spelled nine times in seven files)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from unirank.hang.ending import end_in_turn, first_within
from unirank.hang.standby import silent_after, takeover_line
from unirank.hang.timings import (
    ANSWER,
    AWAIT_REPORT,
    LATE_LOOK,
    LINGER,
    SILENT,
    STOP_ANSWER,
    Timing,
)
from unirank.supervisor.stopreport import START_ALLOWANCE

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "unirank"
#: a wait computed by hand from the interval (``2 * interval + 3``, ``4 * x.interval + 6.0``)
BY_HAND = re.compile(r"\b\d+(?:\.\d+)? \* [\w.]*interval \+ \d|[\w.]*interval \+ \d")

#: (page, a sentence with the wait in a group, the wait): each doc sentence that says one (its
#: lines joined by single blanks)
SENTENCES: tuple[tuple[str, str, Timing], ...] = (
    ("docs/troubleshooting.md", r"It waits at most (.+?) \(the watchers';", ANSWER),
    ("docs/troubleshooting.md", r"and at most (.+?) more \(the watchers'\) for the stacks",
     STOP_ANSWER),
    ("docs/performance.md", r"plus at most (.+?) while a rank hangs", STOP_ANSWER),
    ("docs/troubleshooting.md", r"once rank 0 has set no record for (.+?) \(rank 2", SILENT),
    ("docs/troubleshooting.md", r"record, at most (.+?) old, to show it waiting", LATE_LOOK),
)


def test_each_wait_in_seconds_and_in_words() -> None:
    assert [t.of(1.0) for t in (ANSWER, STOP_ANSWER, LATE_LOOK, LINGER, SILENT, AWAIT_REPORT)] \
        == [5.0, 3.0, 3.0, 5.0, 10.0, 5.0]
    assert ANSWER.words() == "two intervals and 3 s"
    assert STOP_ANSWER.words() == "one interval and 2 s"
    assert SILENT.words() == "four intervals and 6 s"
    assert SILENT.interval_for(SILENT.of(0.75)) == 0.75


def test_the_modules_take_their_waits_from_timings() -> None:
    assert first_within(0.5) == LATE_LOOK.of(0.5) and silent_after(0.5) == SILENT.of(0.5)
    assert "for 8 s " in takeover_line(1, 0.5)
    found = [f"{path.relative_to(SRC)}:{number}: {line.strip()}"
             for path in SRC.rglob("*.py") if path.name != "timings.py"
             and "rdzv" not in path.parts  # the rendezvous's timings are its own
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if BY_HAND.search(line.split("#")[0])]
    assert found == []


def test_a_rank_that_is_not_blamed_lingers_for_linger() -> None:
    class Store:
        def __init__(self) -> None:
            self.counts: dict[str, int] = {}

        def add(self, key: str, amount: int) -> int:
            self.counts[key] = self.counts.get(key, 0) + amount
            return self.counts[key]

    from unirank.hang.ending import FIRST_KEY, Ending

    store = Store()
    store.add(FIRST_KEY, 1)  # a blamed rank recorded: no wait
    linger = end_in_turn(store, 2, 4, 0.5, Ending("x", (3,), by=0), lambda _: None,
                         lambda _: None)
    assert linger == LINGER.of(0.5)


@pytest.mark.parametrize(("page", "sentence", "timing"), SENTENCES,
                         ids=[f"{p}:{t.words()}" for p, _, t in SENTENCES])
def test_the_docs_state_each_wait_as_timings_says(page: str, sentence: str,
                                                  timing: Timing) -> None:
    text = " ".join((ROOT / page).read_text(encoding="utf-8").split())  # one line
    found = re.findall(sentence, text)
    assert found, f"{page}: no sentence matches {sentence!r}"
    assert set(found) == {timing.words()}, f"{page}: says {found}, timings {timing.words()}"


def test_the_docs_examples_agree_with_one_interval() -> None:
    """The troubleshooting page's examples of a frozen rank (its stack's wait, a standby's
    takeover line, the stop report's wait) come from runs at one interval: each number must
    be the wait of that same interval."""
    text = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    stacks = {float(n) for n in re.findall(r"no stack within (\d+(?:\.\d+)?) s", text)}
    silent = {float(n) for n in re.findall(r"sent no progress record for (\d+(?:\.\d+)?) s", text)}
    at_most = {float(n) for n in re.findall(r"before forwarding it \(at most (\d+) s;", text)}
    assert stacks and silent and at_most
    intervals = {ANSWER.interval_for(n) for n in stacks} | {SILENT.interval_for(n) for n in silent}
    assert len(intervals) == 1, (stacks, silent)
    interval = intervals.pop()
    assert interval > 0
    # the engine prints the stop report's deadline, just after it was set, rounded
    assert at_most == {float(int(START_ALLOWANCE + STOP_ANSWER.of(interval)))}
