"""Per-worker error files: when a worker's program failed, and with what (torchrun's contract).

torchrun gives every worker ``TORCHELASTIC_ERROR_FILE``; ``torch.distributed.elastic``'s
``@record`` writes the worker's exception there as JSON, and torchrun reports the failure with the
earliest timestamp as the root cause. ``unirank run`` gives its workers the same variable, and
unirank writes the same file (plus a sub-second ``unirank_time``) at the moment the user's code
raises, before the process group is torn down. That matters: when one rank raises, its peers
fail a moment later with "connection closed by peer", and they may well *exit* first; the
timestamps, not the order of exits, say which rank was the cause. A record whose message says
that a peer went away (gloo's "Connection closed by peer", a reset connection, NCCL's aborted
communicator or watchdog timeout) is a *consequence* (:attr:`RecordedFailure.lost_peer`): the
supervisor blames it only when no rank failed on its own account.

No torch here: the supervisor parent reads these files.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from unirank.contract import ERROR_FILE_VAR
from unirank.errors import ConfigError
from unirank.exitcodes import REQUEUE as REQUEUE_EXIT_CODE

__all__ = [
    "ERROR_FILE_VAR",
    "LOST_PEER",
    "RecordedFailure",
    "exit_status",
    "read_failure",
    "record_exception",
]

#: what torch says in a rank whose peer went away (its failure is a consequence of the peer's)
LOST_PEER = re.compile(
    r"connection closed by peer|connection reset by peer|broken pipe|"
    r"remote process exited|communicator was aborted|watchdog caught collective|"
    r"failed to recv, got 0 bytes",
    re.IGNORECASE,
)


def exit_status(code: object) -> int:
    """The exit status of a process that ends with ``SystemExit(code)`` uncaught, as CPython
    gives it: 0 for None; an int's low 8 bits (``256`` -> 0, ``-1`` -> 255, ``True`` -> 1), and
    255 for an int beyond a C long; 1 for anything else (which the interpreter prints to stderr).
    """
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if -sys.maxsize - 1 <= code <= sys.maxsize else 0xFF
    return 1


def record_exception(exc: BaseException, environ: Mapping[str, str] | None = None, *,
                     exit_code: int | None = None) -> None:
    """Write ``exc`` to this worker's error file, unless it is a clean exit (a ``SystemExit``
    whose :func:`exit_status` is 0, or :data:`~unirank.exitcodes.REQUEUE`:
    stopped to be requeued, not a failure) or already written; ``exit_code``: the status the
    process ends with (default: a SystemExit's, else 1).

    The first record wins: the exception where the failure started, not a later one raised
    while unwinding. Never raises (a failure report must not hide the failure).

    Reads: TORCHELASTIC_ERROR_FILE.
    """
    if isinstance(exc, SystemExit) and exit_status(exc.code) in (0, REQUEUE_EXIT_CODE):
        return
    path = (os.environ if environ is None else environ).get(ERROR_FILE_VAR)
    if not path:
        return
    now = time.time()
    payload = {
        "message": {
            "message": f"{type(exc).__name__}: {exc}" + "".join(
                f"\n{note}" for note in getattr(exc, "__notes__", None) or ()
                if isinstance(note, str)),
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(exc)),
                "timestamp": str(int(now)),
            },
        },
        "unirank_time": now,
        "unirank_exit_code": (exit_code if exit_code is not None
                              else exit_status(exc.code) if isinstance(exc, SystemExit) else 1),
        "unirank_config_error": isinstance(exc, ConfigError),
    }
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "x", encoding="utf-8") as fh:
            json.dump(payload, fh)
    except (OSError, TypeError, ValueError):
        pass


@dataclass(frozen=True)
class RecordedFailure:
    """What a worker's error file says: when (seconds since the epoch), what, the exit code
    the exception means (1, or a SystemExit's :func:`exit_status`), whether it was a
    ConfigError (a one-line launch or usage mistake), and whether its message says a peer went
    away (:data:`LOST_PEER`: the failure of another rank, seen here)."""

    time: float
    message: str
    exit_code: int
    config_error: bool = False
    lost_peer: bool = False


def read_failure(path: str | os.PathLike[str]) -> RecordedFailure | None:
    """The failure recorded in ``path`` (by unirank or by torch's ``@record``), or None."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        message = data.get("message", {})
        if isinstance(message, dict):
            text = str(message.get("message", ""))
            stamp = message.get("extraInfo", {}).get("timestamp")
        else:
            text, stamp = str(message), None
        # torch's @record keeps whole seconds only: the file's own time says when it failed
        when = (float(data["unirank_time"]) if "unirank_time" in data
                else os.stat(path).st_mtime if stamp is not None else float("nan"))
        code = int(data.get("unirank_exit_code", 1))
        config_error = data.get("unirank_config_error") is True
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return RecordedFailure(when, text.strip().splitlines()[-1] if text.strip() else "", code,
                           config_error, LOST_PEER.search(text) is not None)
