"""``unirank run`` as PID 1 of a container: a small init in front of the supervisor.

PID 1 of a PID namespace is special in two ways. The kernel gives it no default signal
actions (a SIGTERM with no handler does nothing, so a pod would wait out its whole grace period
and then be SIGKILLed), and every orphaned process of the namespace becomes its child, which
must be reaped or it stays a zombie. torchrun as PID 1 reaps only its own workers.

So when ``unirank run`` finds itself PID 1 (:func:`is_init`), it forks first, before any
thread, helper or worker exists (:func:`stand_in_for_init`, called from ``unirank run``'s
start). The child goes on as ``unirank run`` (the supervisor, with the normal signal rules of a
process that is not PID 1), in a process group of its own that is the terminal's foreground
group when there is a terminal, so that a terminal's Ctrl-C reaches it once. PID 1 stays
behind as an init, like ``docker run --init`` (tini): it forwards every signal in
:data:`unirank.signals.PID1_PASSED` to the child (Kubernetes' SIGTERM at a pod's stop: the
supervisor forwards it to the ranks, which save within the grace period,
``ur.stop_requested()``), reaps every process that ends in the namespace (:func:`classify` tells
the supervisor's end from an orphan's), and exits with the supervisor's exit code
(:func:`exit_code`: 128 + N for a death by signal N) as soon as the supervisor has ended; the
kernel then kills whatever is left in the namespace.

The decisions (:func:`is_init`, :func:`exit_code`, :func:`forward`, :func:`classify`) are pure;
:func:`stand_in_for_init` and :func:`_serve` are the thin loop. The signal handler does nothing:
signals arrive as bytes on a wakeup pipe. The init waits as long as the supervisor runs (the
supervisor has its own timeouts); it never waits once the supervisor has ended.

Reads: no environment variable.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
from collections.abc import Iterable, Sequence
from types import FrameType

from unirank.exitcodes import killed_by
from unirank.signals import PID1_PASSED

__all__ = ["classify", "exit_code", "forward", "is_init", "stand_in_for_init"]


def is_init(pid: int) -> bool:
    """True for PID 1 (a container's first process, ``unshare --pid --fork``)."""
    return pid == 1


def exit_code(status: int) -> int:
    """The exit code of a process that ended with wait status ``status``, as a shell gives it:
    its own code, or 128 + N after a death by signal N."""
    code = os.waitstatus_to_exitcode(status)
    return killed_by(-code) if code < 0 else code


def forward(signals: Iterable[int]) -> list[int]:
    """Of the signals that arrived (in order), the ones to pass on to the supervisor."""
    wanted = {int(s) for s in PID1_PASSED}
    return [s for s in signals if s in wanted]


def classify(reaped: Sequence[tuple[int, int]], main: int) -> tuple[int | None, int]:
    """Of the ``(pid, wait status)`` pairs just reaped: the supervisor's (``main``) exit code,
    or None when it is still running, and how many orphans were reaped with it."""
    code = None
    orphans = 0
    for pid, status in reaped:
        if pid == main:
            code = exit_code(status)
        else:
            orphans += 1
    return code, orphans


def _noop(signum: int, frame: FrameType | None) -> None:
    """The signal arrives as a byte on the wakeup pipe; the handler itself does nothing."""


def _reap_all() -> list[tuple[int, int]]:
    """Every child that has ended, reaped now (never waits)."""
    reaped: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append((pid, status))


def _take_terminal() -> None:
    """In the child: a process group of its own, the terminal's foreground group if stdin is
    a terminal (so a Ctrl-C reaches the supervisor once, not once from the terminal and once
    from the init)."""
    os.setpgid(0, 0)
    try:
        if os.isatty(0):
            old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            try:
                os.tcsetpgrp(0, os.getpgrp())
            finally:
                signal.signal(signal.SIGTTOU, old)
    except OSError:
        pass


def _serve(child: int, wake_r: int) -> int:
    """The init's loop: pass on the signals, reap everything; the supervisor's exit code once
    it has ended."""
    while True:
        code, _ = classify(_reap_all(), child)
        if code is not None:
            return code
        select.select([wake_r], [], [])
        try:
            arrived = os.read(wake_r, 512)
        except BlockingIOError:
            continue
        for signum in forward(arrived):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)


def stand_in_for_init(pid: int | None = None) -> None:
    """When this process is PID 1, fork: return in the child (which goes on as ``unirank run``)
    and, in PID 1, forward signals, reap and exit with the child's exit code (never returns).
    Elsewhere, return at once. Call it before any thread or child process exists.

    ``pid``: this process's id (default ``os.getpid()``).
    """
    if not is_init(os.getpid() if pid is None else pid):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    # handlers first, so that no signal is lost between the fork and the loop
    watched = (*PID1_PASSED, signal.SIGCHLD)
    old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    old = {sig: signal.signal(sig, _noop) for sig in watched}
    child = os.fork()
    if child == 0:
        signal.set_wakeup_fd(old_wakeup)
        for sig, handler in old.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        os.close(wake_r)
        os.close(wake_w)
        _take_terminal()
        return
    code = _serve(child, wake_r)
    os._exit(code)
