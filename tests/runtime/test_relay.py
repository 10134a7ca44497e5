"""The console relay (runtime/relay.py): a stream that is not a file gets the engine's bytes as
whole lines of text; a file's own descriptor is used as it is."""

from __future__ import annotations

import contextvars
import io
import os
import sys
from pathlib import Path

from unirank.runtime.relay import ConsoleRelay, own_fd


class Recorder(io.TextIOBase):
    """A stream like a Jupyter kernel's: text only, no descriptor; keeps each write."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)


def test_a_stream_without_a_descriptor_gets_whole_lines() -> None:
    stream = Recorder()
    with ConsoleRelay(stream) as (fd,):
        os.write(fd, b"[rank0]:one\n[rank1]:tw")
        os.write(fd, "o \u00e9".encode()[:-1])  # a character cut in two
        os.write(fd, "o \u00e9".encode()[-1:] + b"\n[rank0]:last, no newline")
    assert "".join(stream.writes) == "[rank0]:one\n[rank1]:two \u00e9\n[rank0]:last, no newline"
    assert all(w.endswith("\n") for w in stream.writes[:-1])  # every write whole lines


def test_a_file_is_written_through_its_own_descriptor(tmp_path: Path) -> None:
    with open(tmp_path / "out.txt", "w", encoding="utf-8") as fh:
        fh.write("first\n")  # buffered: the relay flushes it before the engine writes
        with ConsoleRelay(fh) as (fd,):
            assert fd == fh.fileno()
            os.write(fd, b"second\n")
    assert (tmp_path / "out.txt").read_text() == "first\nsecond\n"
    assert own_fd(io.StringIO()) is None
    assert own_fd(Recorder()) is None
    assert own_fd(sys.__stderr__) == sys.__stderr__.fileno()


CELL: contextvars.ContextVar[str] = contextvars.ContextVar("cell")


class CellStream(Recorder):
    """A stream like ipykernel's: it sends each write to the cell its context names."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[str] = []

    def write(self, text: str) -> int:
        self.cells.append(CELL.get("no cell"))
        return super().write(text)


def test_the_relay_writes_in_the_callers_context() -> None:
    stream = CellStream()
    token = CELL.set("cell 7")
    try:
        with ConsoleRelay(stream) as (fd,):
            os.write(fd, b"[rank0]:hello\n")
    finally:
        CELL.reset(token)
    assert stream.cells == ["cell 7"]
