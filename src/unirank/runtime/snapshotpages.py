"""The memory tier's pages: a dropped step's files wait, under no step's name, for the next
save to write over them instead of taking new pages.

A node's memory holds its newest whole steps; each save writes a new step folder and drops the
oldest. In ``/dev/shm`` a new file costs the kernel a fresh, zeroed page for every 4 KiB, and
removing one frees them all again: for 512 MiB here 0.21 s to write a new file and 0.07 s to
remove one, against 0.08 s to write the same bytes over an old file. So a dropped step's files
are not removed: they wait in the tier's :data:`~unirank.statekeep.rules.PAGES` folder (one
step's files at most) and the next save's files, its own and the copies that come from the
peer, are written over them (:func:`take_pages`), under the names the new step gives them.
A file waiting there has no name a step counts, so its old bytes can never be read as a new
step's: a file takes a step's name only once it is written over in full (a writer truncates
what is left of the old file; a copy is received whole before it is renamed in).

DCP's writer takes them through :class:`unirank.runtime.snapshotread.SummedFiles`, the copies
through :func:`unirank.runtime.snapshotcopies.carry`. This module imports no part of torch
(torch.distributed.checkpoint, imported where a program never saves, made some programs abort
at their exit: it is imported only on first use).

Reads: nothing from the environment.
"""

from __future__ import annotations

import contextlib
import os
import shutil

from unirank.statekeep.rules import MARKS, METADATA, PAGES

__all__ = ["give_back", "take_pages", "uncount", "waiting_bytes"]


def _pages_of(tier: str) -> str:
    return os.path.join(tier, PAGES)


def take_pages(tier: str, path: str, name: str | None = None) -> bool:
    """Move the waiting file of ``tier``'s pages named ``name`` (default: ``path``'s name),
    if one waits, to ``path`` (to be written over); whether one was there."""
    waiting = os.path.join(_pages_of(tier), name or os.path.basename(path))
    try:
        os.replace(waiting, path)
    except OSError:
        return False
    return True


def waiting_bytes(tier: str) -> int:
    """The bytes of the files waiting in ``tier``'s pages (the next save's to write over)."""
    total = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(_pages_of(tier)):
            with contextlib.suppress(OSError):
                total += entry.stat().st_size
    return total


def uncount(folder: str) -> None:
    """A step folder (of any tier) stops counting at once: its ``.metadata`` goes (DCP
    writes it last), then its marks (:data:`~unirank.statekeep.rules.MARKS`)."""
    for name in (METADATA, *MARKS):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder, name))


def give_back(tier: str, folder: str) -> None:
    """A dropped step folder of ``tier`` (a node's memory): its data files wait in the tier's
    pages for the next save (those waiting from before are freed first); the rest goes. Its
    ``.metadata`` goes first, so the step stops counting at once."""
    uncount(folder)
    pages = _pages_of(tier)
    shutil.rmtree(pages, ignore_errors=True)
    try:
        os.mkdir(pages)
        names = [entry.name for entry in os.scandir(folder)
                 if entry.is_file() and not entry.name.startswith(".")]
    except OSError:
        names = []
    for name in names:
        with contextlib.suppress(OSError):
            os.rename(os.path.join(folder, name), os.path.join(pages, name))
    shutil.rmtree(folder, ignore_errors=True)
