"""torch's C++ reports kept off ``unirank doctor``'s output.

A store or group that does not form makes torch's C++ code log warnings with whole frame dumps
(``Exception raised from ...``, ``frame #0: ...``) straight to file descriptor 2, dozens of lines
before the table. The ``group`` row already says what failed, so :func:`without_cpp_frames`
catches file descriptor 2 around the group check (it and every process started meanwhile write
to a temporary file) and passes on only the other lines. Reads no environment variables.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

__all__ = ["is_cpp_noise", "without_cpp_frames"]

#: torch's C++ log lines (``[W1125 18:46:29.883 TCPStore.cpp:340] ...``), its exceptions' frame
#: dumps, also as quoted by a failure summary (``    | frame #3: ...``)
_NOISE = re.compile(r"^\s*(?:\|\s*)?(?:frame #\d+:|Exception raised from |"
                    r"<omitting python frames>|\[[WEIF]\d{4} \d)")


def is_cpp_noise(line: str) -> bool:
    """True for a line of torch's C++ logging or frame dumps, and for a blank line."""
    return not line.strip() or _NOISE.match(line) is not None


@contextlib.contextmanager
def without_cpp_frames() -> Iterator[None]:
    """Run the body with file descriptor 2 caught in a temporary file, then write what was
    caught to stderr without torch's C++ lines (:func:`is_cpp_noise`)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().decode(errors="replace").splitlines()
            kept = [line for line in lines if not is_cpp_noise(line)]
            if kept:
                sys.stderr.write("\n".join(kept) + "\n")
                sys.stderr.flush()
