"""The node's snapshot memory: one owned folder per run in the shared memory file system
(``/dev/shm``), where the workers' snapshots outlive the workers.

``unirank run`` makes it when the run starts (:func:`make_memory_folder`), tells every worker
(UNIRANK_STATE_MEMORY), and when the run ends (a stop, a failure, the end) first copies the
newest step the node holds whole to the program's disk folder where the disk lacks it
(:func:`flush_to_disk`: a stop loses no step), then removes it (:func:`remove_memory_folder`);
a run killed before that leaves it to the next run's sweep (:mod:`unirank.sweep`: its owner is
gone).
Files in ``/dev/shm`` are memory: a snapshot there costs no disk I/O to write or to read back.

Reads: UNIRANK_STATE_SHM (:func:`memory_root`, from the mapping given), UNIRANK_STATE_MEMORY
(:func:`memory_folder_of`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping

from unirank.contract import STATE_MEMORY_VAR, STATE_SHM_VAR
from unirank.statekeep.rules import METADATA, WHOLE, parse_step, step_folder, to_flush

__all__ = ["DISK_NOTE", "SHM", "flush_to_disk", "make_memory_folder", "memory_folder_of",
           "memory_root", "note_disk_folder", "remove_memory_folder"]

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


#: in the node's memory: the disk folder the program named (``ur.save_state``'s ``folder``)
DISK_NOTE = "disk-folder"


def note_disk_folder(memory: str, disk: str) -> None:
    """Remember the program's disk folder in the node's memory (for :func:`flush_to_disk`)."""
    note = os.path.join(memory, DISK_NOTE)
    with contextlib.suppress(OSError), open(note, encoding="utf-8") as fh:
        if fh.read() == disk:
            return
    with contextlib.suppress(OSError):
        part = f"{note}.{os.getpid()}"
        with open(part, "w", encoding="utf-8") as fh:
            fh.write(disk)
        os.replace(part, note)


def _whole_steps(memory: str) -> dict[int, list[str]]:
    """The steps this node's memory holds whole, with their files (the WHOLE marks)."""
    found: dict[int, list[str]] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(memory):
            step = parse_step(name)
            if step is None:
                continue
            with contextlib.suppress(OSError, ValueError), \
                    open(os.path.join(memory, name, WHOLE), encoding="utf-8") as fh:
                files = json.load(fh)
                if isinstance(files, list) and all(isinstance(f, str) for f in files):
                    found[step] = files
    return found


def _disk_steps(disk: str) -> list[int]:
    steps = []
    with contextlib.suppress(OSError):
        for name in os.listdir(disk):
            step = parse_step(name)
            if step is not None and os.path.exists(os.path.join(disk, name, METADATA)):
                steps.append(step)
    return steps


def flush_to_disk(memory: str | None) -> str | None:
    """As the run ends (a stop, a failure, the end): copy the newest step this node holds
    whole from its memory to the program's disk folder, where it is newer than every step
    there (:func:`.rules.to_flush`), the metadata last; the line that says so, or None."""
    if memory is None:
        return None
    try:
        with open(os.path.join(memory, DISK_NOTE), encoding="utf-8") as fh:
            disk = fh.read()
    except OSError:
        return None
    whole = _whole_steps(memory)
    step = to_flush(whole, _disk_steps(disk))
    if step is None:
        return None
    source, target = os.path.join(memory, step_folder(step)), os.path.join(disk, step_folder(step))
    try:
        os.makedirs(target, exist_ok=True)
        for name in [*sorted(set(whole[step]) - {METADATA}), METADATA]:
            part = os.path.join(target, f"{name}.{os.getpid()}.part")
            shutil.copyfile(os.path.join(source, name), part)
            os.replace(part, os.path.join(target, name))
    except OSError as exc:
        return f"could not keep the state of step {step} in {disk}: {exc.strerror or exc}"
    return f"the state of step {step} kept in {disk} (from this node's memory)"
