"""A pytest plugin (loaded by tests/conftest.py): each pytest process's own temporary folder,
checked at the end for what unirank runs left in it.

At configure time every pytest process gets a folder of its own and points TMPDIR (for every
process a test starts) and :data:`tempfile.tempdir` (for itself) at it: the controller a fresh
``ci-tests-*`` folder (no "unirank" in its paths: tests look for that word in stacks), each
xdist worker a folder inside the controller's (``gw0``, ...), so that the workers' run folders,
job files (``unirank stacks`` lists this node's jobs there) and ``tmp_path`` never meet, and
other test runs on the machine add nothing to what is counted.
Names stay short: unix socket paths under them must fit 107 bytes. When the whole run ends, the
controller (or a run without xdist) checks its folder and every worker's:

1. the sweep every ``unirank run`` does when it starts (:func:`unirank.sweep.sweep`) removes
   what runs killed on purpose (``Runner.close`` SIGKILLs launchers) left; they are counted;
2. what is still there and named ``unirank-*`` is a leftover: a folder a dead run keeps for a
   report (the rule of :mod:`unirank.sweep`) is named as kept; anything else (a live owner:
   a process the tests leaked; an entry with no owner) is named too, and with ``CI=true``
   fails the session; the same for the runs' snapshot memory, made in the folder's ``shm``
   (UNIRANK_STATE_SHM points there for every process a test starts);
3. the folder is removed, unless tests failed: then it is kept for its logs and named.

Reads: CI (through ``in_ci``), TMPDIR. Sets: TMPDIR, UNIRANK_STATE_SHM.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from _procs import in_ci


def leftovers(folder: Path) -> tuple[int, list[str], list[str]]:
    """Sweep ``folder`` as a new run whose temporary folder it is would; how many entries
    went, the folders kept for a report, and the other ``unirank-*`` entries left."""
    from unirank.owner import DEAD, state_of_record
    from unirank.sweep import read_owner, sweep

    shm = folder / SHM
    swept = len(sweep(tmp=str(folder), shm=str(shm)))
    kept: list[str] = []
    left: list[str] = []
    for entry in sorted([*folder.glob("unirank-*"), *shm.glob("unirank-*")]):
        record = read_owner(str(entry)) if entry.is_dir() else None
        dead = record is not None and state_of_record(record) == DEAD
        (kept if dead else left).append(entry.name)
    return swept, kept, left


#: inside it, where runs make their snapshot memory (UNIRANK_STATE_SHM: not ``/dev/shm``)
SHM = "shm"
#: this pytest process's own temporary folder
_OWN = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Make this process's own temporary folder and point TMPDIR at it (module docstring)."""
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker:
        folder = Path(tempfile.gettempdir()) / worker  # TMPDIR: the controller's folder
        folder.mkdir()
    else:
        folder = Path(tempfile.mkdtemp(prefix="ci-tests-"))
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = None  # gettempdir() looks again
    (folder / SHM).mkdir()
    os.environ["UNIRANK_STATE_SHM"] = str(folder / SHM)
    config.stash[_OWN] = folder


def _check_all(folder: Path) -> tuple[int, list[str], list[str]]:
    """:func:`leftovers` of ``folder`` and of each xdist worker's folder inside it, each swept
    as a run whose TMPDIR it was would sweep it."""
    swept, kept, left = 0, [], []
    for each in [folder, *sorted(p for p in folder.glob("gw*") if p.is_dir())]:
        found = leftovers(each)
        prefix = "" if each == folder else f"{each.name}/"
        swept += found[0]
        kept += [prefix + name for name in found[1]]
        left += [prefix + name for name in found[2]]
    return swept, kept, left


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In the controller (or a run without xdist): say what the tests' runs left, fail the
    session for leftovers with CI=true, and remove the folders (module docstring)."""
    folder = session.config.stash.get(_OWN, None)
    if folder is None or hasattr(session.config, "workerinput"):
        return
    swept, kept, left = _check_all(folder)
    lines = [f"temporary folder: {swept} entries of killed runs swept"]
    if kept:
        lines.append(f"kept for a report (the sweep's rule): {', '.join(kept)}")
    if left:
        lines.append(f"LEFT BEHIND by the tests' runs: {', '.join(left)}")
        if in_ci() and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if session.exitstatus == pytest.ExitCode.OK:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        lines.append(f"the tests' temporary folder is kept for its logs: {folder}")
    if reporter is not None and (swept or kept or left or session.exitstatus):
        for line in lines:
            reporter.write_line(line, red=bool(left), yellow=bool(kept) and not left)
