"""``unirank top``'s output (pure): a :class:`~unirank.hang.view.View` as the lines of a table
that fits a given width, or as one JSON object.

The table: a header (the job, its ranks and nodes, where its store is, the refresh), one line
per rank, one per spare node waiting to join (rank ``-``, state ``spare``), then the lines that
say why a rank is marked (and which node's link is slow), wrapped to the width. Columns are
dropped, the least needed first (restarts, last collective, node, share waiting), until the
rest fits; a marked rank's line starts with ``!`` and names its state in capitals (``STUCK``,
``SLOW``), so that the marks show without colour. Golden files: tests/fixtures/top.

Reads no environment variable.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from unirank.hang.view import SLOW, SPARE, STUCK, Row, View
from unirank.words import counted

__all__ = ["Header", "render_view", "view_json"]


@dataclass(frozen=True)
class Header:
    """What the view says about the job."""

    job: str
    world_size: int
    store: str
    interval: float
    stuck_after: float
    #: spare nodes waiting to join the elastic job (None: unknown here, not under unirank run)
    spares: int | None = None
    #: their names ("" where not known)
    spare_nodes: tuple[str, ...] = ()
    #: the node whose link the rendezvous names slow now ("": none)
    slow_link: str = ""


@dataclass(frozen=True)
class _Column:
    title: str
    cell: Callable[[Row], str]
    right: bool
    #: the order in which columns are dropped to fit (the highest first); 0: never
    drop: int


def _rate(row: Row) -> str:
    return "-" if row.per_s is None else f"{row.per_s:.1f}"


def _share(row: Row) -> str:
    return "-" if row.waiting is None else f"{100 * row.waiting:.0f}%"


def _last(row: Row) -> str:
    if row.number is None:
        return "-"
    return f"{row.op} #{row.number}" if row.op else f"#{row.number}"


def _state(row: Row) -> str:
    return row.state.upper() if row.state in (STUCK, SLOW) else row.state


_COLUMNS = (
    _Column("", lambda r: "!" if r.state in (STUCK, SLOW) else " ", False, 0),
    _Column("RANK", lambda r: str(r.rank) if r.rank >= 0 else "-", True, 0),
    _Column("NODE", lambda r: r.node or "-", False, 3),
    _Column("STATE", _state, False, 0),
    _Column("COLL/S", _rate, True, 0),
    _Column("WAIT", _share, True, 2),
    _Column("LAST", _last, False, 4),
    _Column("RESTARTS", lambda r: "-" if r.restarts is None else str(r.restarts), True, 5),
)


def _fit(rows: tuple[Row, ...], width: int) -> list[tuple[_Column, int]]:
    """The columns kept and their widths: dropped, highest ``drop`` first, until they fit."""
    columns = [(c, max([len(c.title)] + [len(c.cell(r)) for r in rows])) for c in _COLUMNS]
    for level in (5, 4, 3, 2):
        if sum(w for _, w in columns) + len(columns) - 1 <= width:
            break
        columns = [(c, w) for c, w in columns if c.drop != level]
    return columns


def _line(cells: list[tuple[str, int, bool]], width: int) -> str:
    text = " ".join(c.rjust(w) if right else c.ljust(w) for c, w, right in cells).rstrip()
    return text[:width]


def render_view(view: View, header: Header, width: int, height: int | None = None
                ) -> list[str]:
    """The table's lines, none wider than ``width`` and, with ``height``, no more than that
    where it can: then the marked ranks and the notes stay, the other ranks after the first
    that fit are counted in one line (see the module docstring)."""
    width = max(width, 20)
    nodes = f" ({', '.join(view.nodes)})" if view.nodes and len(view.nodes) <= 4 else ""
    head = (f"unirank top: job {header.job}, {counted(header.world_size, 'rank')} on "
            f"{counted(len(view.nodes), 'node')}{nodes}")
    more = (f"store {header.store}; every {header.interval:g} s; stuck after "
            f"{header.stuck_after:g} s"
            + (f"; {counted(header.spares, 'spare node')} waiting" if header.spares else ""))
    lines = [*textwrap.wrap(head, width, subsequent_indent="  "),
             *textwrap.wrap(more, width, subsequent_indent="  ")]
    said = ((f"slow link: node {header.slow_link} (its link is slow or saturated; every "
             "rank's collectives wait for it)",) if header.slow_link else ())
    notes = [n for note in (*said, *view.notes)
             for n in textwrap.wrap(f"! {note}", width, subsequent_indent="  ")]
    spares = [Row(-1, name, SPARE) for name in header.spare_nodes]
    rows = _shown(view.rows, None if height is None else
                  height - len(lines) - 1 - len(notes) - len(spares))
    columns = _fit((*view.rows, *spares), width)
    lines.append(_line([(c.title, w, c.right) for c, w in columns], width))
    lines += [_line([(c.cell(row), w, c.right) for c, w in columns], width) for row in rows]
    if len(rows) < len(view.rows):
        lines.append(f"... {counted(len(view.rows) - len(rows), 'more rank')} (--json: all)"
                     [:width])
    lines += [_line([(c.cell(row), w, c.right) for c, w in columns], width) for row in spares]
    return lines + notes


def _shown(rows: tuple[Row, ...], room: int | None) -> list[Row]:
    """The rows that fit in ``room`` lines (one kept to count the others): every marked
    one, then the others in rank order; all of them where they fit or ``room`` is None."""
    if room is None or len(rows) <= room:
        return list(rows)
    marked = {r.rank for r in rows if r.state in (STUCK, SLOW)}
    free = max(0, room - 1 - len(marked))
    others = [r.rank for r in rows if r.rank not in marked][:free]
    kept = marked | set(others)
    return [r for r in rows if r.rank in kept]


def view_json(view: View, header: Header, now: float) -> dict[str, Any]:
    """The view as one JSON object (its schema: docs/top.md)."""
    return {"time": round(now, 3), "job": header.job, "world_size": header.world_size,
            "nodes": list(view.nodes), "store": header.store, "interval": header.interval,
            "stuck_after": header.stuck_after, "spares": header.spares,
            "spare_nodes": list(header.spare_nodes), "slow_link": header.slow_link or None,
            "ranks": [{"rank": r.rank, "node": r.node, "state": r.state,
                       "collectives_per_s": None if r.per_s is None else round(r.per_s, 3),
                       "share_waiting": None if r.waiting is None else round(r.waiting, 4),
                       "op": r.op, "collective": r.number, "restarts": r.restarts}
                      for r in view.rows],
            **view.marked, "notes": list(view.notes)}
