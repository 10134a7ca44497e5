"""torchelastic's file-based watchdog, as torchrun's agent serves it: with
TORCHELASTIC_ENABLE_FILE_TIMER=1, ``unirank run`` makes a named pipe (TORCHELASTIC_TIMER_FILE,
else a fresh one in the temporary folder), gives its path to the workers in
TORCHELASTIC_TIMER_FILE, and reads the requests that torch's ``FileTimerClient`` writes there
(``timer.configure(FileTimerClient(path))``, then ``with timer.expires(after=S): ...``): a worker
still inside a scope past its deadline gets the request's signal (SIGKILL by default), as
torch's ``FileTimerServer`` sends it.

The decisions are pure (:class:`Timers`: requests in, the pids to signal out); :class:`TimerServer`
is the thread that reads the pipe and sends the signals. No torch here: the parent never imports
it. The request format is torch's ``FileTimerRequest.to_json``: one JSON object a line with
``version``, ``pid``, ``scope_id``, ``expiration_time`` (seconds since the epoch; negative: a
release) and ``signal``.

Reads (from the mapping :func:`timer_file` is given): TORCHELASTIC_ENABLE_FILE_TIMER,
TORCHELASTIC_TIMER_FILE.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from unirank.contract import ENABLE_FILE_TIMER_VAR, TIMER_FILE_VAR
from unirank.signals import start_shielded

__all__ = ["TimerServer", "Timers", "timer_file"]

#: seconds between two looks at the deadlines (torchrun's agent: 0.1)
INTERVAL = 0.1


def timer_file(environ: Mapping[str, str]) -> str | None:
    """The pipe's path when the watchdog is asked for (TORCHELASTIC_ENABLE_FILE_TIMER=1):
    TORCHELASTIC_TIMER_FILE, else a fresh path in the temporary folder; None otherwise.

    Reads: TORCHELASTIC_ENABLE_FILE_TIMER, TORCHELASTIC_TIMER_FILE.
    """
    if environ.get(ENABLE_FILE_TIMER_VAR, "").strip() != "1":
        return None
    given = environ.get(TIMER_FILE_VAR, "").strip()
    return given or os.path.join(tempfile.gettempdir(), f"watchdog_timer_{uuid.uuid4()}")


@dataclass
class Timers:
    """The scopes each worker is in, with their deadlines and signals (pure)."""

    #: (pid, scope) -> (deadline, signal)
    scopes: dict[tuple[int, str], tuple[float, int]] = field(default_factory=dict)

    def take(self, line: str) -> None:
        """One request line; a malformed one is dropped."""
        try:
            request = json.loads(line)
            key = (int(request["pid"]), str(request["scope_id"]))
            deadline = float(request["expiration_time"])
            signum = int(request.get("signal", 0))
        except (ValueError, KeyError, TypeError):
            return
        if deadline < 0:
            self.scopes.pop(key, None)
        else:
            self.scopes[key] = (deadline, signum)

    def expired(self, now: float) -> dict[int, int]:
        """pid -> the signal to send, for every worker with a scope past its deadline (the
        earliest such scope's positive signal, as torch's server; none for signal 0). The
        expired scopes are forgotten."""
        due: dict[int, list[tuple[float, int]]] = {}
        for (pid, scope), (deadline, signum) in list(self.scopes.items()):
            if deadline <= now:
                due.setdefault(pid, []).append((deadline, signum))
                del self.scopes[(pid, scope)]
        out = {}
        for pid, scopes in due.items():
            signals = [s for _d, s in sorted(scopes) if s > 0]
            if signals:
                out[pid] = signals[0]
        return out


class TimerServer:
    """The thread that reads the pipe at ``path`` and signals the workers past a deadline;
    :meth:`close` stops it and removes the pipe."""

    def __init__(self, path: str) -> None:
        self.path = path
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        os.mkfifo(path, 0o600)
        # read and write ends of our own: the pipe never reports an end when clients close
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self._keep = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        self._stop = threading.Event()
        self._timers = Timers()
        self._thread = threading.Thread(target=self._loop, name="unirank-file-timer",
                                        daemon=True)
        start_shielded(self._thread)

    def _loop(self) -> None:
        pending = b""
        while not self._stop.is_set():
            ready, _, _ = select.select([self._fd], [], [], INTERVAL)
            if ready:
                with contextlib.suppress(BlockingIOError):
                    pending += os.read(self._fd, 65536)
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._timers.take(line.decode("utf-8", "replace"))
            for pid, signum in self._timers.expired(time.time()).items():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signum)

    def close(self) -> None:
        """Stop the thread; remove the pipe."""
        self._stop.set()
        self._thread.join(timeout=5)
        for fd in (self._fd, self._keep):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)
