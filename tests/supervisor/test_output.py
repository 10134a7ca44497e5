"""Whole lines out of a worker's stream: :class:`unirank.supervisor.output.LineBuffer` (pure)."""

from __future__ import annotations

from unirank.supervisor.output import (
    PARTIAL_LINE_DELAY,
    PARTIAL_LINE_LIMIT,
    TAG_TEMPLATE,
    LineBuffer,
    OutputOptions,
    tag_for,
)


def test_line_prefixer() -> None:
    prefixer = LineBuffer(tag_for(3))
    assert prefixer.feed(b"hel") == b""
    assert prefixer.feed(b"lo\nwor") == b"[rank3]:hello\n"
    assert prefixer.feed(b"ld\n\nx\r y\n") == b"[rank3]:world\n[rank3]:\n[rank3]:x\r y\n"
    assert prefixer.feed(b"tail") == b""
    assert prefixer.close() == b"[rank3]:tail\n"
    assert prefixer.close() == b""


def test_an_unbuffered_print_comes_out_as_one_line() -> None:
    # print("loss:", 4.5) under python -u: four writes, one line
    lines = LineBuffer()
    assert [lines.feed(part, 1.0) for part in (b"loss:", b" ", b"4.5", b"\n")] == [
        b"", b"", b"", b"loss: 4.5\n"]
    assert lines.deadline is None and not lines.open


def test_a_partial_line_is_due_after_the_delay_and_its_line_stays_open() -> None:
    lines = LineBuffer(b"[r0]:")
    assert lines.feed(b"epoch 1 ", 10.0) == b""
    assert lines.feed(b"...", 10.05) == b""
    assert lines.deadline == 10.0 + PARTIAL_LINE_DELAY  # from its first byte, not its last
    assert lines.flush_partial() == b"[r0]:epoch 1 ..."
    assert lines.open and lines.deadline is None
    assert lines.feed(b" done\nnext\n", 10.2) == b" done\n[r0]:next\n"  # no second prefix
    assert not lines.open


def test_a_long_partial_line_passes_at_once() -> None:
    lines = LineBuffer()
    assert lines.feed(b"x" * PARTIAL_LINE_LIMIT, 0.0) == b"x" * PARTIAL_LINE_LIMIT
    assert lines.open


def test_carriage_returns_pass_at_once_for_progress_bars() -> None:
    lines = LineBuffer()
    assert lines.feed(b"\r 10%|#", 0.0) == b"\r"
    assert lines.flush_partial() == b" 10%|#"
    assert lines.feed(b"\r 20%|##\r 30%|###", 0.2) == b"\r 20%|##\r"
    assert lines.flush_partial() == b" 30%|###"
    assert lines.open
    assert lines.close() == b"\n"


def test_an_interrupted_line_ends_once_and_its_rest_starts_a_new_line() -> None:
    lines = LineBuffer(b"[r1]:")
    lines.feed(b"half", 0.0)
    assert lines.interrupt() == b""  # nothing was passed on yet: nothing to end
    assert lines.flush_partial() == b"[r1]:half"
    assert lines.interrupt() == b"\n"
    assert lines.interrupt() == b""
    assert lines.feed(b"\n", 0.3) == b""  # the newline that ended "half" was written already
    assert lines.feed(b"after\n", 0.3) == b"[r1]:after\n"
    lines.feed(b"more", 0.4)
    lines.flush_partial()
    lines.interrupt()
    assert lines.feed(b" rest\n", 0.6) == b"[r1]: rest\n"  # a continuation on a line of its own


def test_workers_write_unbuffered_when_tagged_or_on_a_terminal() -> None:
    assert not OutputOptions().unbuffered  # a file or a pipe: workers buffer as they would
    assert OutputOptions(console_tty=True).unbuffered  # a terminal: lines show as printed
    assert OutputOptions(prefix_template=TAG_TEMPLATE).unbuffered
