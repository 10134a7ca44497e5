"""Many streams on one console: :mod:`unirank.supervisor.console` (pure), checked against golden
files -- the exact bytes a terminal (``*.tty``) or a log file (``*.log``) receives for a given
interleaving of the ranks' outputs -- and against what a terminal then shows
(``tests/_screen.py``). ``python3 tests/supervisor/test_console.py`` writes the golden files
again after an intended change (read their diff before committing them)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from _screen import screen
from unirank.supervisor.console import LogView, TerminalView, fit
from unirank.supervisor.rows import RankRows

GOLDEN = Path(__file__).resolve().parent.parent / "fixtures" / "console"

#: (seconds, stream key, bytes the worker wrote)
Event = tuple[float, int, bytes]


def _bar(name: str, step: int, total: int = 4) -> bytes:
    """One tqdm-like redraw: "\\r", the bar, padding."""
    return f"\r{name}: {step}/{total} |{'#' * step}{' ' * (total - step)}|".encode()


# rank 0 (key 0) and rank 1 (key 2) each draw a bar; rank 1 (its stderr, key 3) prints lines
_TWO_BARS: list[Event] = [
    (0.0, 0, _bar("r0", 0)), (0.0, 2, _bar("r1", 0)),
    (0.1, 0, _bar("r0", 1)), (0.1, 3, b"rank 1 says hello\n"),
    (0.2, 2, _bar("r1", 1)), (0.3, 0, _bar("r0", 2)), (0.4, 2, _bar("r1", 2)),
    (6.0, 0, _bar("r0", 3)), (6.1, 3, b"rank 1 says bye\n"), (6.2, 2, _bar("r1", 3)),
    (6.3, 0, _bar("r0", 4) + b"\n"), (6.4, 2, _bar("r1", 4) + b"\n"),
    (6.5, 0, b"done\n"),
]

# tqdm's position=rank: rank 1 (key 2) moves down a row, draws, moves back up, each redraw
_POSITIONED: list[Event] = [
    (0.0, 0, _bar("r0", 0)), (0.0, 2, b"\n"), (0.0, 2, _bar("r1", 0)), (0.0, 2, b"\x1b[A"),
    *((0.1 * step, key, chunk) for step in range(1, 5)
      for key, chunk in ((0, _bar("r0", step)), (2, b"\n"), (2, _bar("r1", step)),
                         (2, b"\x1b[A"))),
    (1.0, 0, b"\n"), (1.0, 2, b"\n"), (1.0, 2, b"\r" + b" " * 16), (1.0, 2, b"\x1b[A"),
]

# a nested bar under an outer one on rank 0's stderr (key 0), lines on its stdout (key 1), both
# tagged, on a terminal 24 columns wide; the inner bar is erased at its end (leave=False)
_NESTED: list[Event] = [
    (0.0, 0, _bar("epoch", 0, 2)), (0.0, 0, b"\n"), (0.0, 0, _bar("batch of epoch 0", 0)),
    (0.0, 0, b"\x1b[A"), (0.1, 0, b"\n"), (0.1, 0, _bar("batch of epoch 0", 4)),
    (0.1, 0, b"\x1b[A"), (0.2, 0, b"\n\r" + b" " * 30 + b"\x1b[A"),
    (0.2, 0, _bar("epoch", 1, 2)), (0.3, 1, b"rank 0 epoch 0 loss 0.5\n"),
    (0.4, 0, _bar("epoch", 2, 2) + b"\n"),
]

_SCENARIOS = {"two_bars": (_TWO_BARS, 80, ("", "", "", "")),
              "positioned": (_POSITIONED, 80, ("", "", "", "")),
              "nested_tagged": (_NESTED, 24, ("[rank0]:", "[rank0]:", "", ""))}


def _play(view: TerminalView | LogView, events: Sequence[Event],
          prefixes: Sequence[str]) -> list[bytes]:
    """What ``view`` writes after each event, then at each stream's end (in key order)."""
    rows = {key: RankRows() for key in range(len(prefixes))}
    writes = []
    for now, key, chunk in events:
        lines = rows[key].feed(chunk)
        writes.append(view.update(key, prefixes[key], lines, rows[key].live(), now))
    for key, stream in rows.items():
        writes.append(view.update(key, prefixes[key], stream.close(), [], 99.0))
    return writes


def _terminal(name: str) -> list[bytes]:
    events, width, prefixes = _SCENARIOS[name]
    return _play(TerminalView(width), events, prefixes)


def _log(name: str) -> list[bytes]:
    events, _width, prefixes = _SCENARIOS[name]
    return _play(LogView(), events, prefixes)


@pytest.mark.parametrize("name", sorted(_SCENARIOS))
def test_a_terminal_receives_the_golden_bytes(name: str) -> None:
    assert b"".join(_terminal(name)) == (GOLDEN / f"{name}.tty").read_bytes()


@pytest.mark.parametrize("name", sorted(_SCENARIOS))
def test_a_log_receives_the_golden_bytes(name: str) -> None:
    written = b"".join(_log(name))
    assert written == (GOLDEN / f"{name}.log").read_bytes()
    assert b"\x1b" not in written and b"\r" not in written


@pytest.mark.parametrize("name", sorted(_SCENARIOS))
def test_a_terminal_is_never_sent_an_erase_below(name: str) -> None:
    """tmux takes ``\\x1b[J`` at the top left for a clear screen and keeps the screen in its
    scrollback: a bar drawn on the first row would leave a line there at every redraw (issue
    44; tests/supervisor/test_bars_in_tmux.py counts them in tmux itself)."""
    assert b"\x1b[J" not in b"".join(_terminal(name))
    assert b"\x1b[2K" in b"".join(_terminal(name))


def test_a_shorter_block_leaves_no_row_of_the_longer_one() -> None:
    view = TerminalView(80)
    out = view.update(0, "", [], ["bar 0"]) + view.update(2, "", [], ["bar 1"])
    out += view.update(0, "", ["bar 0 done"], []) + view.update(2, "", [], ["bar 1 again"])
    assert screen(out) == ["bar 0 done", "bar 1 again"]


def test_two_bars_redraw_in_place_below_the_lines_and_their_final_states_stay() -> None:
    writes = _terminal("two_bars")
    seen = b""
    for chunk in writes:  # at every moment: the lines printed so far, then at most two bars
        seen += chunk
        assert len(screen(seen)) <= 2 + 3
    assert screen(seen) == ["rank 1 says hello", "rank 1 says bye", "r0: 4/4 |####|",
                            "done", "r1: 4/4 |####|"]


def test_a_positioned_bar_gets_its_own_row_and_is_erased_as_tqdm_asks() -> None:
    writes = _terminal("positioned")
    before_the_end = len(_POSITIONED) - 4
    assert screen(b"".join(writes[:before_the_end])) == ["r0: 4/4 |####|", "r1: 4/4 |####|"]
    assert screen(b"".join(writes)) == ["r0: 4/4 |####|"]  # leave=False at position 1


def test_nested_bars_are_cut_to_the_width_and_the_inner_one_goes() -> None:
    writes = _terminal("nested_tagged")
    middle = screen(b"".join(writes[:6]), width=24)
    assert middle == ["[rank0]:epoch: 0/2 |  |", "[rank0]:batch of epoch"]
    assert all(len(row) < 24 for row in middle)
    # a finished line wraps as any line does; the bar's final state stays
    assert screen(b"".join(writes), width=24) == [
        "[rank0]:rank 0 epoch 0 l", "oss 0.5", "[rank0]:epoch: 2/2 |##|"]


def test_a_log_shows_a_bar_at_its_start_every_few_seconds_and_at_its_end() -> None:
    text = b"".join(_log("two_bars")).decode()
    assert text.splitlines() == [
        "r0: 0/4 |    |", "r1: 0/4 |    |", "rank 1 says hello", "r0: 3/4 |### |",
        "rank 1 says bye", "r1: 3/4 |### |", "r0: 4/4 |####|", "done", "r1: 4/4 |####|"]


def test_fit_cuts_to_one_column_less_than_the_width_and_keeps_colours_whole() -> None:
    assert fit("abcdef", 4) == "abc"
    assert fit("abc", 4) == "abc"
    assert fit("\x1b[32mabcdef", 4) == "\x1b[32mabc\x1b[0m"
    assert fit("\u5b66\u7fd2\u4e2d", 6) == "\u5b66\u7fd2"  # two columns each


def test_a_line_from_unirank_itself_goes_above_the_bars() -> None:
    view = TerminalView(80)
    view.update(0, "", [], ["bar 1"])
    out = view.update(-1, "", ["unirank run: something"], [])
    assert screen(b"bar 1" + out) == ["unirank run: something", "bar 1"]


def _regenerate() -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name in _SCENARIOS:
        (GOLDEN / f"{name}.tty").write_bytes(b"".join(_terminal(name)))
        (GOLDEN / f"{name}.log").write_bytes(b"".join(_log(name)))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    _regenerate()


def test_a_terminal_of_no_size_is_80_columns() -> None:
    from unirank.supervisor.console import DEFAULT_WIDTH, terminal_width

    assert terminal_width(0) == DEFAULT_WIDTH == 80  # stty size: "0 0" (script -q -c, docker -t)
    assert terminal_width(None) == 80  # the size cannot be read
    assert terminal_width(132) == 132 and terminal_width(1) == 1


def test_a_line_that_carries_the_tag_already_gets_no_second_one() -> None:
    from unirank.supervisor.console import LogView, TerminalView, tagged

    # torch's excepthook writes "[rank1]: " before each traceback line once a group started
    assert tagged("[rank1]:", "[rank1]: Traceback") == "[rank1]: Traceback"
    assert tagged("[rank1]:", "[rank0]: x") == "[rank1]:[rank0]: x"
    assert tagged("", "[rank1]: x") == "[rank1]: x"
    lines = ["[rank1]: Traceback (most recent call last):", "epoch 1"]
    expected = b"[rank1]: Traceback (most recent call last):\n[rank1]:epoch 1\n"
    assert TerminalView().update(1, "[rank1]:", lines, []) == expected
    assert LogView().update(1, "[rank1]:", lines, []) == expected
