"""The remote side of ``unirank run --hosts``: ``unirank run --from-ssh`` on each host.

ssh without a tty forwards no signal, so the local launcher's only hold on a remote
``unirank run`` is the ssh channel: its stdin. The first line of that stdin is the carried
environment (:func:`unirank.supervisor.ssh.remote.encode_environ`); after it the stream stays
open until the local launcher stops the job, dies (even by SIGKILL: the pipe's end closes with
it) or loses the connection. Then stdin ends, and this process sends itself SIGTERM, which
``unirank run``'s engine handles as always: the workers get SIGTERM, SIGKILL after the grace
period, and the summary is printed.

The workers get ``/dev/null`` as stdin: the stream is the parent's alone. The watch is a
thread of the parent (never of the fork server). Reads no environment variable.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time

from unirank.errors import ConfigError
from unirank.signals import start_shielded
from unirank.supervisor.ssh.remote import decode_environ

__all__ = ["ENVIRON_TIMEOUT_S", "take_environ", "watch_stdin"]

#: seconds to wait for the environment's line (the local launcher writes it at once)
ENVIRON_TIMEOUT_S = 30.0


def _read_line(fd: int, timeout: float) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in data:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(0.0, left))
        if not ready:
            raise ConfigError(f"got no environment on stdin within {timeout:g} s",
                              variable="--from-ssh", value=None,
                              hint="--from-ssh is for unirank run --hosts only")
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0]


def take_environ(timeout: float = ENVIRON_TIMEOUT_S) -> tuple[dict[str, str], int]:
    """Read the environment's line from stdin, then move stdin out of the workers' way:
    fd 0 becomes ``/dev/null`` and the stream lives on as the returned fd (not inherited)."""
    line = _read_line(0, timeout)
    environ = decode_environ(line)
    kept = os.dup(0)  # close-on-exec, and never passed to a worker
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return environ, kept


def _watch(fd: int, pid: int) -> None:
    try:
        while os.read(fd, 65536):
            pass
    except OSError:
        pass
    os.kill(pid, signal.SIGTERM)


def watch_stdin(fd: int) -> threading.Thread:
    """Send this process SIGTERM when ``fd`` ends (a daemon thread)."""
    thread = threading.Thread(target=_watch, args=(fd, os.getpid()), name="unirank-ssh-stdin",
                              daemon=True)
    start_shielded(thread)
    return thread
