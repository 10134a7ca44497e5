"""What the test programs that keep a job's state share (tests/statekeep): the source of a
``digest(state)`` function, put at the head of each program's text, that names the state
bit for bit (its ``model`` tensors and its ``step``)."""

from __future__ import annotations

import json
from typing import Any

#: ``import hashlib`` and ``def digest(state)``, as program text
DIGEST = '''
import hashlib

def digest(state):
    h = hashlib.sha256()
    for key in sorted(state["model"]):
        h.update(state["model"][key].numpy().tobytes())
    h.update(str(state["step"]).encode())
    return h.hexdigest()
'''


def records(stdout: str) -> list[dict[str, Any]]:
    """The JSON records a program printed, one per line (a prefix before ``{`` skipped)."""
    return [json.loads(line[line.index("{"):]) for line in stdout.splitlines() if "{" in line]
