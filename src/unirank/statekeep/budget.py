"""How much of the node's memory the job's snapshots may take (pure).

The budget is a size (``8G``, ``512M``, bytes) or a share of the shared memory file system
(``50%``, the default: ``/dev/shm`` is usually half of the machine's memory, and the snapshots
share it with the program's own shared memory, as DataLoader workers'). A share is taken of
``/dev/shm``'s size or of the memory the snapshots could take, whichever is smaller: the
machine's available memory plus what this node's snapshots hold already (in containers
``/dev/shm`` is often as large as all the machine's memory, and the nodes of one host share
it). A snapshot goes to the
node's memory only where what the node holds there plus the new step (this node's part and
its peer's copy) stays within the budget and the file system has the room; else that step
goes to the disk folder only, and rank 0 says so once.
"""

from __future__ import annotations

import re

from unirank.errors import ConfigError

__all__ = ["DEFAULT_BUDGET", "format_bytes", "parse_budget", "refusal"]

#: the budget where none is given: a share of the shared memory file system
DEFAULT_BUDGET = "50%"
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?", re.IGNORECASE)
_SHARE = re.compile(r"(\d+(?:\.\d+)?)\s*%")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_budget(text: str, shm_total: int, *, variable: str,
                 memory: int | None = None) -> int:
    """The budget in bytes: ``N%`` of ``shm_total`` or of ``memory`` (the memory the
    snapshots could take; None: not known), whichever is smaller, or a size (``8G``,
    ``512M``, ``4096``). ConfigError naming ``variable`` for anything else."""
    value = text.strip()
    share = _SHARE.fullmatch(value)
    if share and 0 <= float(share.group(1)) <= 100:
        base = shm_total if memory is None else min(shm_total, memory)
        return int(base * float(share.group(1)) / 100)
    size = _SIZE.fullmatch(value)
    if size and not share:
        return int(float(size.group(1)) * _UNITS[size.group(2).lower()])
    raise ConfigError("not a memory budget", variable=variable, value=text,
                      hint="give a share of /dev/shm (50%) or a size (8G, 512M)")


def format_bytes(count: int) -> str:
    """``1.5 GiB``, ``512.0 MiB``, ``100 B``."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


def refusal(need: int, held: int, free: int, budget: int) -> str | None:
    """Why a new step of ``need`` bytes (this node's part and its peer's copy) does not go to
    the node's memory, which holds ``held`` bytes of snapshots, has ``free`` bytes left and
    a ``budget``; None where it fits."""
    if held + need > budget:
        return (f"a snapshot of {format_bytes(need)} does not fit the node's snapshot memory "
                f"({format_bytes(held)} held, budget {format_bytes(budget)})")
    if need > free:
        return (f"a snapshot of {format_bytes(need)} does not fit in the shared memory left "
                f"({format_bytes(free)} free)")
    return None
