"""A node that gives up before its workers join tells the others through the rendezvous store.

When ``unirank run`` on one node of several refuses to start (its layout disagrees with the
launcher's, its options are wrong), the other nodes' workers would wait for its ranks until the
init timeout. :func:`tell_others` instead sets the join check's abort value
(:func:`unirank.joincheck.abort_join`) in node 0's store, so every waiting rank ends at once with
this node's name and reason. The store's address is the plan's answer
(:func:`unirank.supervisor.plan.giveup_address`): where no one named the master of the nodes,
there is no one to tell, and nothing is contacted. The parent never imports torch, so the store
client runs in a short helper process (``python -m unirank.supervisor.giveup ADDR PORT
SECONDS REASON`` through :func:`~unirank.supervisor.helper.start_helper`) whose connect is
bounded; when the store cannot be reached in that time, nothing more is done.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping

from unirank.supervisor.helper import start_helper

__all__ = ["GIVE_UP_TIMEOUT", "tell_others"]

#: at most this many seconds to reach node 0's store (it may start a few seconds after this
#: node gave up); the child process gets as long again to import torch
GIVE_UP_TIMEOUT = 20.0


def tell_others(addr: str, port: int, reason: str, environ: Mapping[str, str], *,
                timeout: float = GIVE_UP_TIMEOUT) -> bool:
    """Set this node's ``reason`` (one line, naming the node) in the store at ``addr:port``,
    waiting at most about ``timeout`` seconds for it: True when it was set. The child is a
    helper (:func:`~unirank.supervisor.helper.start_helper`) with the run's ``environ``."""
    args = [addr, str(port), f"{timeout:g}", reason]
    try:
        proc = start_helper("unirank.supervisor.giveup", args, environ)
    except OSError:
        return False
    try:
        return proc.wait(timeout=2 * timeout + 10) == 0
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return False


def _main(argv: list[str]) -> int:
    """The child: connect as a client within the timeout, set the abort value; 0 when set."""
    from unirank.errors import ConfigError
    from unirank.joincheck import abort_join
    from unirank.store import StoreError, open_store

    addr, port, seconds, reason = argv
    try:
        store = open_store(addr, int(port), rank=-1, timeout=float(seconds), hint="")
        abort_join(store, reason)
    except (ConfigError, StoreError, RuntimeError, OSError, ValueError):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
