"""Signals as bytes on a pipe, for the supervisor's loop (:mod:`.engine`): thin.

Inside :func:`signals_on_a_pipe`, each signal of the set (and SIGCHLD, the end of a child)
reaches the process as its number written to a pipe (Python's wakeup fd), whose read end the
loop waits on with the workers' pipes; the handlers themselves do nothing. On the way out, the
handlers and the wakeup fd are restored and the pipe is closed.

Reads no environment variable.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from collections.abc import Callable

    _Handler = Union[Callable[[int, Union[FrameType, None]], Any], int, signal.Handlers, None]

__all__ = ["signals_on_a_pipe"]


def _ignore(signum: int, frame: FrameType | None) -> None:
    """Installed for the signals the loop handles: they arrive through the wakeup fd."""


@contextlib.contextmanager
def signals_on_a_pipe(signals: Iterable[int]) -> Iterator[int]:
    """Inside: ``signals`` and SIGCHLD arrive as bytes on the pipe whose (non-blocking) read end
    is yielded. Must run in the main thread."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    old_handlers: dict[int, _Handler] = {}
    try:
        for sig in {int(signal.SIGCHLD), *signals}:
            old_handlers[sig] = signal.signal(sig, _ignore)
        yield wake_r
    finally:
        signal.set_wakeup_fd(old_wakeup)
        for signum, handler in old_handlers.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        os.close(wake_r)
        os.close(wake_w)
