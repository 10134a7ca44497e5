"""The results a peer's own test suite gives with the peer itself (ignite's tests with ignite,
torch's launcher tests with torchrun), recorded as golden data next to the vendored suite.

The vendored suites (tests/ignite_suite, tests/torchrun_suite) are checked against these: every
test that passes with the peer must pass with unirank. The peer's results depend only on the
pinned versions (ignite 0.5.5, torch 2.13.0, both pinned by the test extra and scripts/setup), so
CI reads them from the recording instead of running the peer again (about 5 minutes of CI on 2
cores). A recording made for other versions than the installed ones fails with the command that
refreshes it.

Environment variables read:

* ``UNIRANK_PEER_REFERENCE=1``: run the peer as well and assert that the recording still holds;
* ``UNIRANK_REGEN_GOLDEN=1`` (as every golden file of the tests): run the peer and rewrite the
  recording (review the diff).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

REFERENCE_VAR = "UNIRANK_PEER_REFERENCE"
REGEN_VAR = "UNIRANK_REGEN_GOLDEN"

#: one suite's results: part (a run, a file set) -> test id -> passed / failed / skipped
Results = dict[str, dict[str, str]]


def peer_runs(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the peer runs again in this session (to check or rewrite the recording)."""
    return environ.get(REFERENCE_VAR) == "1" or environ.get(REGEN_VAR) == "1"


def peer_results(path: Path, versions: Mapping[str, str], part: str,
                 run_peer: Callable[[], dict[str, str]],
                 environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The peer's results of ``part``: recorded in ``path`` for ``versions`` (package ->
    version), or from ``run_peer`` where :func:`peer_runs`, checked against or written to the
    recording."""
    recorded: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    refresh = (f"refresh it: {REGEN_VAR}=1 python -m pytest {path.parent.name}'s test module, "
               "then review the diff")
    if not peer_runs(environ):
        assert recorded.get("versions") == dict(versions), (
            f"{path} was recorded for {recorded.get('versions')}, these are {dict(versions)}: "
            + refresh)
        results: dict[str, str] = recorded["results"][part]
        return results
    live = run_peer()
    if environ.get(REGEN_VAR) == "1":
        parts: Results = dict(recorded.get("results", {}))
        parts[part] = dict(sorted(live.items()))
        path.write_text(json.dumps({"versions": dict(versions), "results": dict(sorted(
            parts.items()))}, indent=1) + "\n")
    else:
        assert recorded.get("versions") == dict(versions), refresh
        assert recorded["results"][part] == live, f"{path} ({part}) no longer holds: " + refresh
    return live
