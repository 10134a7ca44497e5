"""The node's snapshot memory: one owned folder per run in the shared memory file system
(``/dev/shm``), where the workers' snapshots outlive the workers.

``unirank run`` makes it when the run starts (:func:`make_memory_folder`), tells every worker
(UNIRANK_STATE_MEMORY) and removes it when the run ends (:func:`remove_memory_folder`); a run
killed before that leaves it to the next run's sweep (:mod:`unirank.sweep`: its owner is gone).
Files in ``/dev/shm`` are memory: a snapshot there costs no disk I/O to write or to read back.

Reads: UNIRANK_STATE_SHM (:func:`memory_root`, from the mapping given), UNIRANK_STATE_MEMORY
(:func:`memory_folder_of`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping

from unirank.contract import STATE_MEMORY_VAR, STATE_SHM_VAR

__all__ = ["SHM", "make_memory_folder", "memory_folder_of", "memory_root",
           "remove_memory_folder"]

#: the shared memory file system of Linux
SHM = "/dev/shm"


def memory_root(environ: Mapping[str, str]) -> str:
    """Where runs make their snapshot memory: UNIRANK_STATE_SHM, else ``/dev/shm`` where it is
    a folder this user can write, else the temporary folder (the snapshots then cost disk)."""
    chosen = environ.get(STATE_SHM_VAR, "")
    if chosen:
        return chosen
    if os.path.isdir(SHM) and os.access(SHM, os.W_OK | os.X_OK):
        return SHM
    return tempfile.gettempdir()


def make_memory_folder(environ: Mapping[str, str]) -> str | None:
    """A new owned folder for a run's snapshots; None where none can be made (the workers then
    keep snapshots on disk only, and say so)."""
    from unirank.sweep import STATE_PREFIX, make_owned_folder

    try:
        return make_owned_folder(STATE_PREFIX, memory_root(environ))
    except OSError:
        return None


def remove_memory_folder(path: str | None) -> None:
    """Free a run's snapshot memory (the run ended: the disk copy is what outlives it)."""
    if path:
        shutil.rmtree(path, ignore_errors=True)


def memory_folder_of(environ: Mapping[str, str]) -> str | None:
    """The snapshot memory ``unirank run`` made for this worker's run; None under any other
    launcher (or where it is gone)."""
    path = environ.get(STATE_MEMORY_VAR, "")
    return path if path and os.path.isdir(path) else None
