"""The watcher reads the program's stacks without keeping them: after a record or a stacks
answer, the program's frames (and their locals: a process group, tensors) are freed when the
program leaves them, not when the cycle collector runs. A gloo group that lived on to the
collector at the interpreter's exit aborted the process under srun (torch 2.13)."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from _fakestore import FakeStore
from unirank.contract import HangSettings
from unirank.hang.progress import other_threads_frames
from unirank.hang.watcher import Watcher


class Held:
    """Stands for what a program's frame holds (a process group)."""


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _held_while(read: Callable[[], Any]) -> weakref.ref[Held]:
    """Run ``read`` in this thread while another thread's frame holds a :class:`Held`; the
    other thread then leaves that frame and ends. A weak reference to what it held."""
    entered, leave = threading.Event(), threading.Event()
    refs: list[weakref.ref[Held]] = []

    def program() -> None:
        held = Held()
        refs.append(weakref.ref(held))
        entered.set()
        leave.wait(30)

    thread = threading.Thread(target=program)
    thread.start()
    assert entered.wait(30)
    read()
    leave.set()
    thread.join(30)
    return refs[0]


def _watcher() -> Watcher:
    store = FakeStore()
    return Watcher(rank=0, world_size=2, node="nodeA", settings=HangSettings(60.0, None, 5.0),
                   connect=lambda: store, environ={})


@pytest.mark.usefixtures("collector_off")
def test_a_record_keeps_no_frame_of_the_program() -> None:
    watcher = _watcher()
    assert _held_while(watcher.record)() is None


@pytest.mark.usefixtures("collector_off")
def test_a_stacks_answer_keeps_no_frame_of_the_program() -> None:
    watcher = _watcher()
    assert _held_while(watcher.stacks)() is None


def test_other_threads_frames_leaves_out_the_callers_own() -> None:
    frames = other_threads_frames()
    assert threading.get_ident() not in frames
