"""A pytest plugin (loaded by tests/conftest.py): the test session's own temporary folder,
checked at the end for what unirank runs left in it.

At the first test the session makes a fresh folder in pytest's base temporary folder and
points TMPDIR (for every process a test starts) and :data:`tempfile.tempdir` (for this one)
at it, so that other test runs on the machine add nothing to what is counted. At the end:

1. the sweep every ``unirank run`` does when it starts (:func:`unirank.sweep.sweep`) removes
   what runs killed on purpose (``Runner.close`` SIGKILLs launchers) left; they are counted;
2. what is still there and named ``unirank-*`` is a leftover: a folder a dead run keeps for a
   report (the rule of :mod:`unirank.sweep`) is named as kept; anything else (a live owner:
   a process the tests leaked; an entry with no owner) is named too, and with ``CI=true``
   fails the session;
3. the folder is removed.

Reads: CI (through ``in_ci``), TMPDIR.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from _procs import in_ci

#: what the session's check found, for :func:`pytest_sessionfinish`
_FOUND = pytest.StashKey[tuple[int, list[str], list[str]]]()


def leftovers(folder: Path) -> tuple[int, list[str], list[str]]:
    """Sweep ``folder`` (the temporary folder now) as a new run would; how many entries went,
    the folders kept for a report, and the other ``unirank-*`` entries left."""
    from unirank.owner import DEAD, state_of_record
    from unirank.sweep import read_owner, sweep

    swept = len(sweep())
    kept: list[str] = []
    left: list[str] = []
    for entry in sorted(folder.glob("unirank-*")):
        record = read_owner(str(entry)) if entry.is_dir() else None
        dead = record is not None and state_of_record(record) == DEAD
        (kept if dead else left).append(entry.name)
    return swept, kept, left


@pytest.fixture(scope="session", autouse=True)
def own_tmpdir(tmp_path_factory: pytest.TempPathFactory,
               request: pytest.FixtureRequest) -> Iterator[Path]:
    """The session's own temporary folder (see the module docstring)."""
    folder = tmp_path_factory.mktemp("tmpdir")
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = None  # gettempdir() looks again
    try:
        yield folder
    finally:
        try:
            request.config.stash[_FOUND] = leftovers(folder)
        finally:
            if before is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = before
            tempfile.tempdir = None
            shutil.rmtree(folder, ignore_errors=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Say what the session's runs left; with CI=true, leftovers fail the session."""
    found = session.config.stash.get(_FOUND, None)
    if found is None:
        return
    swept, kept, left = found
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"temporary folder: {swept} entries of killed runs swept"]
    if kept:
        lines.append(f"kept for a report (the sweep's rule): {', '.join(kept)}")
    if left:
        lines.append(f"LEFT BEHIND by the tests' runs: {', '.join(left)}")
        if in_ci() and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if reporter is not None and (swept or kept or left):
        for line in lines:
            reporter.write_line(line, red=bool(left), yellow=bool(kept) and not left)
