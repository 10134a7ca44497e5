"""Per-worker error files: when a worker's program failed, and with what (torchrun's contract).

torchrun gives every worker ``TORCHELASTIC_ERROR_FILE``; ``torch.distributed.elastic``'s
``@record`` writes the worker's exception there as JSON, and torchrun reports the failure with the
earliest timestamp as the root cause. ``unirank run`` gives its workers the same variable, and
unirank writes the same file (plus a sub-second ``unirank_time``) at the moment the user's code
raises, before the process group is torn down. That matters: when one rank raises, its peers
fail a moment later with "connection closed by peer", and they may well *exit* first; the
timestamps, not the order of exits, say which rank was the cause.

No torch here: the supervisor parent reads these files.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ERROR_FILE_VAR", "failure_time", "record_exception"]

ERROR_FILE_VAR = "TORCHELASTIC_ERROR_FILE"


def record_exception(exc: BaseException, environ: Mapping[str, str] | None = None) -> None:
    """Write ``exc`` to this worker's error file, unless it is a clean exit or already written.

    The first record wins: the exception where the failure started, not a later one raised
    while unwinding. Never raises (a failure report must not hide the failure).

    Reads: TORCHELASTIC_ERROR_FILE.
    """
    if isinstance(exc, SystemExit) and exc.code in (None, 0):
        return
    path = (os.environ if environ is None else environ).get(ERROR_FILE_VAR)
    if not path:
        return
    now = time.time()
    payload = {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(exc)),
                "timestamp": str(int(now)),
            },
        },
        "unirank_time": now,
    }
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "x", encoding="utf-8") as fh:
            json.dump(payload, fh)
    except (OSError, TypeError, ValueError):
        pass


def failure_time(path: str | os.PathLike[str]) -> float | None:
    """When the failure recorded in ``path`` happened (seconds since the epoch), or None.

    Reads ``unirank_time``, else torchelastic's whole-second ``timestamp``.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if "unirank_time" in data:
            return float(data["unirank_time"])
        return float(data["message"]["extraInfo"]["timestamp"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
