"""One worker stream read as a terminal would show it: :class:`unirank.supervisor.rows.RankRows`
(pure)."""

from __future__ import annotations

from unirank.supervisor.rows import MAX_ROWS, RankRows


def test_lines_finish_at_their_newline_and_a_partial_line_is_live() -> None:
    rows = RankRows()
    assert rows.feed(b"one\ntw") == ["one"]
    assert rows.live() == ["tw"]
    assert rows.feed(b"o\n") == ["two"]
    assert rows.live() == []


def test_a_carriage_return_redraws_the_row_and_only_the_final_state_finishes() -> None:
    rows = RankRows()
    assert rows.feed(b"\r 10%|#         |\r 20%|##        |") == []
    assert rows.live() == [" 20%|##        |"]
    assert rows.feed(b"\r100%|##########|\n") == []
    assert rows.close() == ["100%|##########|"]


def test_windows_line_ends_finish_each_line_at_once() -> None:
    rows = RankRows()
    assert rows.feed(b"one\r\ntwo\r\n") == ["one", "two"]


def test_a_shorter_redraw_keeps_the_end_of_the_longer_row_as_a_terminal_does() -> None:
    rows = RankRows()
    rows.feed(b"abcdef\rxy")
    assert rows.live() == ["xycdef"]
    rows.feed(b"\x1b[K")  # erase to the end of the row
    assert rows.live() == ["xy"]


def test_blank_lines_are_kept_in_order() -> None:
    rows = RankRows()
    assert rows.feed(b"a\n\n") == ["a"]  # the blank one waits for what follows
    assert rows.feed(b"b\n") == ["", "b"]
    assert rows.feed(b"\n") == []
    assert rows.close() == [""]


def test_tqdm_position_one_keeps_its_bar_on_its_own_row_and_prints_no_blank_line() -> None:
    rows = RankRows()
    for step in range(3):  # tqdm's display at position=1: moveto(1), the bar, moveto(-1)
        assert rows.feed(b"\n") == []
        assert rows.feed(f"\rbar {step}".encode()) == []
        assert rows.feed(b"\x1b[A") == []
        assert rows.live() == [f"bar {step}"]
    assert rows.positioned
    # close(leave=True) draws the final state where the cursor is, then "\n"
    assert rows.feed(b"\rbar done\n") == []
    assert rows.live() == ["bar done", "bar 2"]
    assert rows.close() == ["bar done", "bar 2"]


def test_nested_bars_stay_live_and_rows_pushed_off_the_top_finish() -> None:
    rows = RankRows()
    rows.feed(b"\router 0\n\rinner 0\x1b[A")
    assert rows.live() == ["outer 0", "inner 0"]
    assert rows.feed(b"\router 1") == []
    assert rows.live() == ["outer 1", "inner 0"]
    # the screen scrolls: "outer 1" leaves it first, then "inner 0"
    assert rows.feed(b"\n" * MAX_ROWS) == ["outer 1"]
    assert rows.feed(b"\n") == ["inner 0"]


def test_a_finished_bar_waits_for_the_next_line_and_comes_before_it() -> None:
    rows = RankRows()
    assert rows.feed(b"\rbar 100%\n") == []
    assert rows.live() == ["bar 100%"]  # still shown, as the last thing this stream drew
    assert rows.feed(b"loss 0.1\n") == ["bar 100%", "loss 0.1"]
    assert rows.feed(b"\rnext 100%\n") == []
    assert rows.close() == ["next 100%"]


def test_a_positioned_stream_erased_at_its_end_leaves_nothing() -> None:
    rows = RankRows()
    rows.feed(b"\n\rbar\x1b[A")
    rows.feed(b"\n\r   \x1b[A")  # leave=False: the bar is overwritten with blanks
    assert rows.live() == []
    assert rows.close() == []


def test_an_escape_sequence_cut_in_two_is_applied_whole() -> None:
    rows = RankRows()
    rows.feed(b"\n\rbar\x1b[")
    rows.feed(b"A\rtop")
    assert rows.live() == ["top", "bar"]


def test_colours_stay_with_the_text_and_bytes_that_are_not_utf8_pass_through() -> None:
    rows = RankRows()
    assert rows.feed(b"\x1b[31mred\x1b[0m \xff\n") == ["\x1b[31mred\x1b[0m \udcff"]


def test_controls_that_do_not_fit_a_shared_screen_are_dropped() -> None:
    rows = RankRows()
    assert rows.feed(b"\x1b[?25l\x1b7a\x1b8b\x1b[2Jc\n") == ["abc"]
    rows.feed(b"half\x1b[")
    assert rows.close() == ["half"]
