"""The signal dispositions a forked worker starts with: those of a child its supervisor exec'ed.

``exec`` keeps an ignored signal ignored and resets a caught one to its default action; the new
Python interpreter then ignores SIGPIPE and SIGXFSZ and, where SIGINT is at its default, raises
``KeyboardInterrupt`` for it. A worker started as its own interpreter gets this from the kernel.
A worker forked from the fork server would instead get the server's dispositions: the server
ignores the signals a job step sends to all its processes (``SHIELDED``) and started with
whatever its starter ignored, so that a ``unirank run`` started in the background by a script
(SIGINT ignored, as a non-interactive shell leaves it) forked workers that ignored the SIGINT
it forwarded. So the supervisor sends, with each spawn, the signals it ignores at that moment
(:func:`ignored_here`: the ones it handles are caught, so not among them), and the forked child
sets every disposition to what ``exec`` and a new interpreter would have made of them
(:func:`after_exec`, the decision; :func:`apply`, the mechanism).

A handler installed outside Python (``signal.getsignal`` answers None) is kept: it is the
interpreter's own faulthandler (``PYTHONFAULTHANDLER``, ``-X faulthandler``: the server starts
with the workers' start-up variables, so a fresh worker would have enabled it too) or a
preloaded library's, which a fresh worker importing it would install as well.

Imports nothing of unirank nor torch: it runs in the supervisor and in a forked child.

Reads no environment variable.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable, Mapping
from types import FrameType
from typing import Any, Union

__all__ = ["Handler", "after_exec", "apply", "ignored_here"]

#: a disposition as ``signal.signal`` takes it
Handler = Union[Callable[[int, Union[FrameType, None]], Any], int, signal.Handlers]

#: the signals no process can catch or ignore
_FIXED = frozenset({int(signal.SIGKILL), int(signal.SIGSTOP)})
#: what a new Python interpreter ignores at start, whatever it inherited
_PYTHON_IGNORES = frozenset(int(getattr(signal, name)) for name in ("SIGPIPE", "SIGXFSZ", "SIGXFZ")
                            if hasattr(signal, name))


def _settable() -> list[int]:
    return sorted(int(s) for s in signal.valid_signals() if int(s) not in _FIXED)


def ignored_here() -> list[int]:
    """The signals this process ignores now (as Python knows them: ``signal.getsignal``), but
    the ones a new interpreter ignores anyway. Call it in the thread that would start the
    worker."""
    return [s for s in _settable()
            if s not in _PYTHON_IGNORES and signal.getsignal(s) == signal.SIG_IGN]


def after_exec(ignored: Iterable[int]) -> dict[int, Handler]:
    """Every catchable signal's disposition in a new Python interpreter that a process ignoring
    ``ignored`` (and catching or defaulting the rest) exec'ed: ignored ones stay ignored,
    SIGPIPE and SIGXFSZ are ignored, SIGINT raises ``KeyboardInterrupt`` unless ignored, the
    rest take their default action."""
    kept = set(ignored)
    dispositions: dict[int, Handler] = {}
    for signum in _settable():
        if signum in kept or signum in _PYTHON_IGNORES:
            dispositions[signum] = signal.SIG_IGN
        elif signum == signal.SIGINT:
            dispositions[signum] = signal.default_int_handler
        else:
            dispositions[signum] = signal.SIG_DFL
    return dispositions


def apply(dispositions: Mapping[int, Handler]) -> None:
    """Set each signal's disposition to ``dispositions``' where it differs (in the main thread
    of a forked child, before the worker's code runs), but where the handler is C code's
    (see the module docstring)."""
    for signum, handler in dispositions.items():
        current = signal.getsignal(signum)
        if current is not None and current != handler:
            signal.signal(signum, handler)
