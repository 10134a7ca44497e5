"""What the test programs that keep a job's state share (tests/statekeep): the source of a
``digest(state)`` function, put at the head of each program's text, that names the state
bit for bit (its ``model`` tensors and its ``step``)."""

from __future__ import annotations

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
