"""``unirank top``: a live view of every rank of a running job, refreshed every second.

From another shell on any node of the job, found as ``unirank stacks`` finds it (the node's
job file, :func:`unirank.cli.stacks.find_job`): at every refresh the command beats the job's
store (:data:`~unirank.storekeys.hang.WATCH_KEY`, so that the ranks' watchers publish their
live records, :mod:`unirank.hang.live`), reads every rank's live and progress records, and
shows :func:`unirank.hang.view.make_view`'s rows. In a terminal it redraws the table in place
on the alternate screen (restored at the end; Ctrl-C ends it with 0); otherwise it prints one
table per refresh, a blank line between two; ``--json`` prints one JSON object per line per
refresh (:func:`unirank.hang.viewtable.view_json`). A store that stops answering (the job
restarts) is looked for again from the job's file for :data:`REATTACH` seconds, unless the
process that ran its attempts on this node has ended (:func:`unirank.hang.jobs.supervisor_gone`).

Reads: SLURM_JOB_ID (through :func:`~unirank.cli.stacks.find_job`), TMPDIR, COLUMNS and LINES
(through :func:`shutil.get_terminal_size`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, TextIO, TypeVar

from unirank.errors import ConfigError
from unirank.signals import STOP_SIGNALS

__all__ = ["add_arguments", "main"]

#: the alternate screen and a hidden cursor; home; erase to the line's end; to the screen's end
_ENTER, _LEAVE = "\x1b[?1049h\x1b[?25l", "\x1b[?25h\x1b[?1049l"
_HOME, _EOL, _EOS = "\x1b[H", "\x1b[K", "\x1b[J"
#: seconds every store call of the view may take before the job counts as gone
STORE_TIMEOUT = 10.0
#: seconds a view waits for the next attempt of a job whose store stopped answering
REATTACH = 15.0
#: an eviction's record: its attempt, every rank of the nodes evicted, why
Eviction = tuple[int, tuple[int, ...], str]
T = TypeVar("T")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``unirank top``."""
    parser.add_argument("--job", default=None, metavar="ID",
                        help="the job's run id or Slurm job id (as unirank stacks)")
    parser.add_argument("--interval", default="1", metavar="S",
                        help="seconds between two refreshes (default: 1)")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per line per refresh (for scripts)")
    parser.add_argument("--count", default=None, metavar="N",
                        help="stop after N refreshes (default: until Ctrl-C)")


def _count(text: str | None) -> int | None:
    if text is None:
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise ConfigError("is not a count of refreshes", variable="--count", value=text,
                          hint="give a whole number, 1 or more")
    return int(text)


class _Stopped:
    """Set by a stop signal but SIGINT (:data:`unirank.signals.STOP_SIGNALS`: the handler
    only sets it); the loop ends at its next refresh."""

    def __init__(self) -> None:
        self.flag = False

    def __call__(self, signum: int, frame: Any) -> None:
        self.flag = True


@contextmanager
def _screen(out: TextIO, live: bool) -> Iterator[None]:
    """The alternate screen while the view runs in a terminal, restored however it ends."""
    if live:
        out.write(_ENTER)
    try:
        yield
    finally:
        if live:
            out.write(_LEAVE)
            out.flush()


def _draw(out: TextIO, lines: list[str], live: bool, first: bool) -> None:
    if live:
        rows = shutil.get_terminal_size().lines
        shown = lines[:rows - 1]  # the last row stays empty: no scroll
        out.write(_HOME + "".join(line + _EOL + "\n" for line in shown) + _EOS)
    else:
        out.write(("" if first else "\n") + "\n".join(lines) + "\n")
    out.flush()


def main(args: argparse.Namespace) -> int:
    """Show the view until Ctrl-C, a stop signal or ``--count`` refreshes (module docstring);
    Ctrl-C and a reader that went away (``unirank top --json | head -1``) end it with 0."""
    try:
        return _view(args)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 0


def _view(args: argparse.Namespace) -> int:
    from unirank.cli.stacks import find_job
    from unirank.contract import parse_seconds

    interval = parse_seconds(str(args.interval), "--interval")
    count = _count(args.count)
    job = find_job(args.job)
    from unirank.store import StoreError, open_store

    try:
        store = open_store(str(job["master_addr"]), int(str(job["master_port"])), rank=-1,
                           timeout=STORE_TIMEOUT, served_by="rank 0",
                           hint="the job may have just ended")
    except StoreError as exc:
        print(f"unirank top: error: {exc.what}", file=sys.stderr)
        return 1
    stopped = _Stopped()
    for signum in STOP_SIGNALS:  # Ctrl-C stays Python's: it ends a store call at once
        if signum != signal.SIGINT:
            signal.signal(signum, stopped)
    live = sys.stdout.isatty() and not args.json
    with _screen(sys.stdout, live):
        return _loop(store, job, interval, _Out(args.json, live, count), stopped)


def _gone(run_id: str) -> int:
    """The store stopped answering and no next attempt came: 0 where the job ended on this node
    (its job files are gone; an elastic job may go on on other nodes, this one evicted), else
    1."""
    from unirank.hang.jobs import find_jobs

    if not find_jobs(run_id):
        print(f"unirank top: job {run_id} ended on this node", file=sys.stderr)
        return 0
    print(f"unirank top: the store of job {run_id} stopped answering: run unirank top again",
          file=sys.stderr)
    return 1


@dataclass
class _Out:
    """Where the refreshes go (JSON lines, the terminal redrawn in place, or tables one after
    another), how many were shown, and the last view of an attempt (with its header)."""

    as_json: bool
    live: bool
    count: int | None
    shown: int = 0
    last: tuple[Any, Any] | None = None

    def more(self) -> bool:
        return self.count is None or self.shown < self.count

    def show(self, view: Any, header: Any, *, kept: bool = True) -> None:
        from unirank.hang.viewtable import render_view, view_json

        if self.as_json:
            print(json.dumps(view_json(view, header, time.time())), flush=True)
        else:
            size = shutil.get_terminal_size()
            lines = render_view(view, header, size.columns, size.lines - 1 if self.live else None)
            _draw(sys.stdout, lines, self.live, self.shown == 0)
        self.shown += 1
        if kept:
            self.last = (view, header)


def _reattach(last: dict[str, object], stopped: _Stopped, out: _Out, interval: float,
              before: Eviction | None) -> tuple[Any, dict[str, object]] | None:
    """The store of the job's next attempt and its job file, once one is written within
    :data:`REATTACH` seconds (a restart: ``--max-restarts``, a change of nodes); meanwhile
    every ``interval`` the last view with every rank restarting
    (:func:`unirank.hang.view.restarting`), but those of the nodes evicted where the node's
    eviction record (:func:`_evicted`) is not ``before``'s, the one the attempt began with.
    None, at once where the process that ran the attempts on this node (the ``last`` job
    file's ``supervisor``) is gone (the job ended), or after ``--count`` refreshes."""
    from unirank.hang.jobs import find_jobs, supervisor_gone
    from unirank.hang.view import restarting
    from unirank.store import StoreError, open_store

    run_id = str(last["run_id"])
    print(f"unirank top: the store of job {run_id} stopped answering: looking for its next "
          f"attempt for {REATTACH:g} s", file=sys.stderr, flush=True)
    deadline = time.monotonic() + REATTACH
    drawn = 0.0
    while time.monotonic() < deadline and not stopped.flag and not supervisor_gone(last):
        if out.last is not None and time.monotonic() - drawn >= interval:
            if not out.more():
                return None
            news = _evicted(last)
            evicted = news[1:] if news is not None and news != before else None
            out.show(restarting(out.last[0], evicted), out.last[1], kept=False)
            drawn = time.monotonic()
        for job in find_jobs(run_id):
            try:
                return open_store(str(job["master_addr"]), int(str(job["master_port"])),
                                  rank=-1, timeout=STORE_TIMEOUT, served_by="rank 0",
                                  hint="the job may have just ended"), job
            except StoreError:
                pass
        time.sleep(min(0.5, interval))  # the next attempt's first rank writes its job file
    return None


def _loop(store: Any, job: dict[str, object], interval: float, out: _Out,
          stopped: _Stopped) -> int:
    """The view over the job's attempts: a store that stops answering is looked for again
    (:func:`_reattach`); the numbers start over with the next attempt's."""
    while True:
        before = _evicted(job)
        if _watch(store, job, interval, out, stopped):
            return 0
        attached = _reattach(job, stopped, out, interval, before)
        if attached is None:
            return 0 if not out.more() else _gone(str(job["run_id"]))
        store, job = attached


def _kept(job: dict[str, object], key: str, read: Callable[[str], T]) -> T | None:
    """What ``read`` finds in the run folder's file the job file names under ``key`` (what
    this node's ``unirank run`` keeps: :mod:`unirank.runfolder`); None where it names none."""
    path = job.get(key)
    return read(path) if isinstance(path, str) and path else None


def _evicted(job: dict[str, object]) -> Eviction | None:
    """The last eviction this node's ``unirank run`` recorded
    (:func:`unirank.runfolder.read_evicted`); None where there is none."""
    from unirank.runfolder import read_evicted

    return _kept(job, "evicted_file", read_evicted)


def _slow_link(job: dict[str, object]) -> str:
    """The node whose link the rendezvous names slow now, as this node's ``unirank run``
    keeps it (:func:`unirank.runfolder.read_slow_link`; "": none)."""
    from unirank.runfolder import read_slow_link

    return _kept(job, "slow_link_file", read_slow_link) or ""


def _spares(job: dict[str, object]) -> tuple[str, ...] | None:
    """The spare nodes that wait to join, by name (the run's spares file this node's
    ``unirank run`` keeps: :func:`unirank.runfolder.read_spare_nodes`); None where there is
    none."""
    from unirank.runfolder import read_spare_nodes

    return _kept(job, "spares_file", read_spare_nodes)


def _watch(store: Any, job: dict[str, object], interval: float, out: _Out,
           stopped: _Stopped) -> bool:
    """Refresh until stopped or ``--count`` refreshes in all (True), or until the store stops
    answering (False)."""
    from unirank.hang.exchange import read_live, read_records
    from unirank.hang.slowrank import read_named
    from unirank.hang.standby import silent_after
    from unirank.hang.view import History, make_view, newest_records, stuck_after
    from unirank.hang.viewtable import Header
    from unirank.storekeys.hang import WATCH_KEY

    world = int(str(job["world_size"]))
    report_after = job.get("report_after")
    limit = None if report_after is None else float(str(report_after))
    silent = silent_after(float(str(job.get("interval", 5.0))))
    header = Header(str(job["run_id"]), world, f"{job['master_addr']}:{job['master_port']}",
                    interval, stuck_after(limit))
    history = History()
    while not stopped.flag and out.more():
        started = time.monotonic()
        try:
            store.add(WATCH_KEY, 1)
            newest = newest_records(read_live(store, world), read_records(store, world))
            named = read_named(store)
        except Exception:
            return False
        for rank, record in newest.items():
            history.add(rank, record)
        spares = _spares(job)
        header = replace(header, spares=None if spares is None else len(spares),
                         spare_nodes=spares or (), slow_link=_slow_link(job))
        out.show(make_view(history.oldest(), history.newest(), world, time.time(), limit,
                           silent, named), header)
        if out.more():
            time.sleep(max(0.0, interval - (time.monotonic() - started)))
    return True
