"""Worker lines kept off the console (:class:`WorkerStreams`' fold file): torch's C++ stack
dumps always, every line once the workers were stopped for a change of the world. Real pipes,
no worker: the test writes what a worker would."""

from __future__ import annotations

import os
import selectors
from collections.abc import Iterator
from pathlib import Path

import pytest

from unirank.supervisor.streams import WorkerStreams

DUMP = ("[W1206 TCPStore.cpp:125] [c10d] recvValue failed\n"
        "Exception raised from recvBytes at Utils.hpp:784 (most recent call first):\n"
        "frame #0: c10::Error::Error() + 0x9d\n"
        "\n")


@pytest.fixture
def wired(tmp_path: Path) -> Iterator[tuple[WorkerStreams, int, int, Path]]:
    """Streams with one worker pipe shown on a console pipe; the worker's write end, the
    console's read end and the fold file."""
    selector = selectors.DefaultSelector()
    console_r, console_w = os.pipe()
    worker_r, worker_w = os.pipe()
    fold = tmp_path / "attempt_0" / "folded.log"
    streams = WorkerStreams(selector, err_fd=console_w, prog="unirank run", fold_file=str(fold))
    streams.add(worker_r, 1, streams.targets(console_w, None), None, None)
    os.set_blocking(console_r, False)
    yield streams, worker_w, console_r, fold
    streams.close()
    for fd in (console_r, console_w, worker_w):
        os.close(fd)
    selector.close()


def _through(streams: WorkerStreams, worker_w: int, console_r: int, text: str) -> str:
    os.write(worker_w, text.encode())
    for key, _ in streams._selector.select(0):  # the engine loop, in short
        streams.pump(key.data)
    try:
        return os.read(console_r, 65536).decode()
    except BlockingIOError:
        return ""


def test_a_c_stack_leaves_the_console_its_warning_stays(
        wired: tuple[WorkerStreams, int, int, Path]) -> None:
    streams, worker_w, console_r, fold = wired
    shown = _through(streams, worker_w, console_r, "step 1\n" + DUMP + "step 2\n")
    assert shown == "step 1\n[W1206 TCPStore.cpp:125] [c10d] recvValue failed\nstep 2\n"
    assert fold.read_text() == "".join(DUMP.splitlines(keepends=True)[1:])
    assert streams.folded() == (f"3 lines of the workers' output (torch's C++ stack dumps) "
                                f"are in {fold}")


def test_once_stopped_every_line_is_folded_and_named(
        wired: tuple[WorkerStreams, int, int, Path]) -> None:
    streams, worker_w, console_r, fold = wired
    assert _through(streams, worker_w, console_r, "step 1\n") == "step 1\n"
    assert streams.folded() is None and not fold.exists()
    streams.fold()
    shown = _through(streams, worker_w, console_r, "Traceback (most recent call last):\n"
                                                   "RuntimeError: Connection reset by peer\n")
    assert shown == ""
    assert fold.read_text() == ("Traceback (most recent call last):\n"
                                "RuntimeError: Connection reset by peer\n")
    assert streams.folded() == ("2 lines of the workers' output (torch's C++ stack dumps, "
                                f"what they printed once stopped) are in {fold}")


def test_without_a_fold_file_nothing_is_folded(tmp_path: Path) -> None:
    selector = selectors.DefaultSelector()
    console_r, console_w = os.pipe()
    worker_r, worker_w = os.pipe()
    streams = WorkerStreams(selector, err_fd=console_w, prog="unirank run")
    streams.add(worker_r, 1, streams.targets(console_w, None), None, None)
    os.set_blocking(console_r, False)
    streams.fold()
    try:
        assert _through(streams, worker_w, console_r, DUMP + "step 2\n") == DUMP + "step 2\n"
        assert streams.folded() is None
    finally:
        streams.close()
        for fd in (console_r, console_w, worker_w):
            os.close(fd)
        selector.close()
