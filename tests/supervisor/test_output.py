"""A worker's stream cut where a terminal acts: :class:`unirank.supervisor.output.LineBuffer`
(pure), and the ``--tag-output`` prefix."""

from __future__ import annotations

from unirank.runfolder import AttemptFolder
from unirank.supervisor.output import (
    PARTIAL_LINE_DELAY,
    PARTIAL_LINE_LIMIT,
    TAG_TEMPLATE,
    LineBuffer,
    LineCopy,
    OutputOptions,
    parse_filters,
)


def test_the_tag_names_the_rank() -> None:
    assert OutputOptions(prefix_template=TAG_TEMPLATE).prefix(3, 1, "default") == b"[rank3]:"


def test_whole_lines_pass_at_once_and_the_rest_waits() -> None:
    lines = LineBuffer()
    assert lines.feed(b"hel") == b""
    assert lines.feed(b"lo\nwor") == b"hello\n"
    assert lines.feed(b"ld\n\nx\r y\n") == b"world\n\nx\r y\n"
    assert lines.feed(b"tail") == b""
    assert lines.flush_partial() == b"tail"
    assert lines.flush_partial() == b""


def test_an_unbuffered_print_comes_out_as_one_line() -> None:
    # print("loss:", 4.5) under python -u: four writes, one line
    lines = LineBuffer()
    assert [lines.feed(part, 1.0) for part in (b"loss:", b" ", b"4.5", b"\n")] == [
        b"", b"", b"", b"loss: 4.5\n"]
    assert lines.deadline is None


def test_a_partial_line_is_due_after_the_delay() -> None:
    lines = LineBuffer()
    assert lines.feed(b"epoch 1 ", 10.0) == b""
    assert lines.feed(b"...", 10.05) == b""
    assert lines.deadline == 10.0 + PARTIAL_LINE_DELAY  # from its first byte, not its last
    assert lines.flush_partial() == b"epoch 1 ..."
    assert lines.deadline is None
    assert lines.feed(b" done\nnext\n", 10.2) == b" done\nnext\n"


def test_a_long_partial_line_passes_at_once() -> None:
    lines = LineBuffer()
    assert lines.feed(b"x" * PARTIAL_LINE_LIMIT, 0.0) == b"x" * PARTIAL_LINE_LIMIT


def test_carriage_returns_and_moves_up_pass_at_once_for_progress_bars() -> None:
    lines = LineBuffer()
    assert lines.feed(b"\r 10%|#", 0.0) == b"\r"
    assert lines.flush_partial() == b" 10%|#"
    assert lines.feed(b"\r 20%|##\r 30%|###", 0.2) == b"\r 20%|##\r"
    assert lines.flush_partial() == b" 30%|###"
    # tqdm's position=1: down a row, the bar, back up (three writes)
    assert lines.feed(b"\n", 0.3) == b"\n"
    assert lines.feed(b"\r 40%|####", 0.3) == b"\r"
    assert lines.feed(b"\x1b[A", 0.3) == b" 40%|####\x1b[A"
    assert lines.deadline is None


def test_workers_write_unbuffered_when_tagged_or_on_a_terminal() -> None:
    assert not OutputOptions().unbuffered  # a file or a pipe: workers buffer as they would
    assert OutputOptions(console_tty=True).unbuffered  # a terminal: lines show as printed
    assert OutputOptions(prefix_template=TAG_TEMPLATE).unbuffered


def test_duplicate_filters_split_on_commas_and_keep_a_doubled_one() -> None:
    """torchrun's comma_separated_list: ``,,`` is a comma inside a filter."""
    assert parse_filters("apple,orange,, juice") == ("apple", "orange, juice")
    assert parse_filters("") == ()


def test_lines_are_copied_from_teed_streams_only() -> None:
    """As torchrun: a stream that is not teed (redirected or on the console only) copies
    nothing; a teed one copies the lines holding any filter, after ``[<role><local_rank>]:``."""
    options = OutputOptions(tee={0: 1, 1: 2}, redirects={2: 3}, stdout_filters=("apple",))
    copy = options.line_copy(0, 1, AttemptFolder("/logs/attempt_0"), "trainer")
    assert copy == LineCopy("/logs/attempt_0/filtered_stdout.log", ("apple",), "[trainer0]:")
    assert copy.picks("an apple pie") and not copy.picks("a banana")
    assert options.line_copy(1, 1, AttemptFolder("/l"), "r") is None  # its stdout is not teed
    assert options.line_copy(2, 1, AttemptFolder("/l"), "r") is None  # redirected, not teed
    assert options.line_copy(0, 2, AttemptFolder("/l"), "r") is None  # no stderr filter
