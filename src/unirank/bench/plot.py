"""``--plot FILE.png``: busbw against message size, log x axis, one line per collective.

Needs matplotlib (the optional extra ``unirank[plot]``); :func:`missing` says so in one line
before any rank starts, so that a long sweep never ends without its picture.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Optional

from unirank.bench.report import Header, Row
from unirank.bench.sizes import human_size

__all__ = ["MISSING", "missing", "write_png"]

MISSING = "unirank bench: --plot needs matplotlib: pip install 'unirank[plot]'"


def missing() -> Optional[str]:
    """:data:`MISSING` when matplotlib cannot be found, else None (imports nothing)."""
    try:
        found = importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):  # a finder that refuses it, a broken sys.modules entry
        found = False
    return None if found else MISSING


def write_png(path: str, header: Header, rows: Sequence[Row]) -> None:
    """Draw the rows' busbw per size, one line per op, and save a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    ops = list(dict.fromkeys(r.op for r in rows))
    for op in ops:
        mine = [r for r in rows if r.op == op and r.size > 0]
        ax.plot([r.size for r in mine], [r.busbw for r in mine], marker="o", markersize=3,
                label=op)
    sizes = sorted({r.size for r in rows if r.size > 0})
    ax.set_xscale("log", base=2)
    ticks = sizes[:: -(-len(sizes) // 9)]  # at most 9 labels: they stay apart
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([human_size(s) for s in ticks])
    ax.set_xlabel("message size (bytes, as nccl-tests counts them)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"unirank bench: {header.world_size} ranks, {header.backend}, "
                 f"{header.dtype}, {header.iters} iters")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
