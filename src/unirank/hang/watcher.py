"""The thread each rank runs for the hang detector (``unirank-hang-watch``, a daemon).

Every interval it reads torch's flight recorder (:func:`_read_recorder`; a torch without
the private ``_dump_fr_trace_json`` gives "no progress information", never an error), sets
this rank's progress record in the job's store (one ``set`` of one key), and checks one
counter (``add(key, 0)``) that asks every rank for its Python stacks: then it sets them
(every thread's, from :func:`sys._current_frames`, read by this thread: no signal is taken,
no code runs in a signal handler). On rank 0 (or a standby while rank 0 is silent:
:mod:`unirank.hang.standby`) it also runs the detector
(:func:`unirank.hang.detect.find_hangs` over every rank's record): when a hang is seen it
asks for the stacks, waits for them a bounded time (a frozen rank does not answer: the report
says so), prints one report (:func:`unirank.hang.render.render_report`) on rank 0's stderr,
writes the full dump as text and JSON next to the attempt's folders (``hang/``), and repeats
it with a doubling interval while the hang lasts. With a hang timeout it then records the
report as rank 0's failure (the error file) and ends rank 0 with
:data:`unirank.hang.HANG_EXIT_CODE`, so that the supervisor ends the job.

Where asked (``measure_waits``: a worker of ``unirank run``, whose rank 0 gathers it), it
looks at the groups' status every 50 ms between two records, to measure the rank's time in
collectives (:mod:`unirank.hang.waits`); :meth:`Watcher.end_record` gives that, with the
thread's own CPU time, to the rank's end-of-run record.

The thread uses a store connection of its own, so it never waits behind the program's or
torch's use of the store.

When an exception leaves a rank's program while its last record showed it waiting in a
collective (torch's collective timeout), :meth:`Watcher.failure_report` makes the report once
more (:mod:`unirank.hang.onstop`); :func:`excepthook_with_report` calls it where no worker
bootstrap does (:func:`unirank.init` under srun, mpirun, torchrun).

Reads: TORCHELASTIC_ERROR_FILE (where rank 0 writes a hang timeout's record; its attempt
folder holds the dumps), TORCH_FR_BUFFER_SIZE (set to :data:`RECORDER_ENTRIES` when unset,
before the program starts its group).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from unirank.contract import ERROR_FILE_VAR, HangSettings
from unirank.hang import HANG_EXIT_CODE, HANG_FOLDER, HANG_VERDICT, WAITING_MARK
from unirank.hang.detect import Hang, find_hangs, verdict
from unirank.hang.jobs import announce, withdraw
from unirank.hang.progress import (
    base_prefixes,
    frames_of,
    group_progress,
    library_prefixes,
    make_record,
    site_of,
    thread_stacks,
    user_frame,
    waits_for,
)
from unirank.hang.render import render_report, wavefront_line
from unirank.hang.standby import Duty, silent_after
from unirank.hang.waits import SAMPLE_PERIOD, WaitMeter, recorder_dump, recorder_status
from unirank.signals import keep_off_this_thread

__all__ = [
    "ASK_KEY",
    "PROGRESS_PREFIX",
    "RECORDER_ENTRIES",
    "RECORDER_VAR",
    "STACKS_PREFIX",
    "THREAD_NAME",
    "HangTimeoutError",
    "Watcher",
    "enable_recorder",
    "excepthook_with_report",
    "progress_key",
    "running",
]

THREAD_NAME = "unirank-hang-watch"
PROGRESS_PREFIX = "unirank/hang/progress/"
ASK_KEY = "unirank/hang/ask"
STACKS_PREFIX = "unirank/hang/stacks/"
#: torch's flight recorder: how many collectives it keeps (its ring buffer)
RECORDER_VAR = "TORCH_FR_BUFFER_SIZE"
#: non-empty while :func:`enable_recorder` has put the recorder's size in the C environment
_RECORDER_PUT: list[bool] = []
RECORDER_ENTRIES = 64


#: added to the stack request counter by rank 0 when it ends the job (``--hang-timeout``): each
#: rank's thread then counts itself in ENDED_KEY and stops using the store, which ends with
#: rank 0's process
ENDING = 1 << 40
ENDED_KEY = "unirank/hang/ended"
#: why rank 0 ends the job (the hang's wavefront), for the other ranks' records
REASON_KEY = "unirank/hang/reason"
#: counted by each rank whose program failed in a collective: the first one prints the report
FAILED_KEY = "unirank/hang/failed"
#: set by that first rank once its report is printed (the others wait for it)
REPORTED_KEY = "unirank/hang/failed-reported"


class _JobEnding(Exception):
    """Rank 0 ends the job: this rank's thread stops."""


class HangTimeoutError(RuntimeError):
    """The job hung longer than ``--hang-timeout`` (rank 0's recorded failure)."""


_RUNNING: list[Watcher] = []


def running() -> Watcher | None:
    """This process's watcher, if one was started (a worker's bootstrap starts it; then
    :func:`unirank.init` does not start another)."""
    return _RUNNING[-1] if _RUNNING else None


def progress_key(rank: int) -> str:
    """The store key of rank ``rank``'s progress record."""
    return f"{PROGRESS_PREFIX}{rank}"


def enable_recorder(environ: Mapping[str, str]) -> None:
    """Turn torch's flight recorder on (before the first group starts), unless the program's
    environment sets its size already: in the C environment only (``os.putenv``), which torch
    reads when the first group starts, so that the program's ``os.environ`` stays torchrun's;
    :func:`recorder_started` takes it out again."""
    if RECORDER_VAR not in environ and not _RECORDER_PUT:
        os.putenv(RECORDER_VAR, str(RECORDER_ENTRIES))
        _RECORDER_PUT.append(True)


def recorder_started() -> None:
    """A group started (torch has read the recorder's size): take the size out of the C
    environment again, so that no process the program starts inherits it."""
    if _RECORDER_PUT:
        os.unsetenv(RECORDER_VAR)
        _RECORDER_PUT.clear()


def _read_recorder() -> dict[str, Any] | None:
    """The flight recorder's dump; {} before torch is loaded; None where torch cannot give it.
    Its entries only while a collective waits: the groups' status alone costs microseconds,
    the entries about a millisecond per hundred.

    Imports nothing: the program's first ``import torch`` is its own (see
    :mod:`unirank.supervisor.worker.lateenv`), and torch's C module is loaded with it."""
    if "torch.distributed" not in sys.modules:
        return {}
    dump = recorder_dump()
    if dump is None:
        return None
    try:
        status = dict(json.loads(dump(False, True)))
        waiting = any(int(g.get("last_enqueued_collective", -1))
                      > int(g.get("last_completed_collective", -1))
                      for g in (status.get("pg_status") or {}).values())
        return dict(json.loads(dump(True, True))) if waiting else status
    except Exception:  # private API: any failure is "no information"
        return None


@dataclass
class _Sites:
    """The user's line behind each group's waiting collective, seen once per collective."""

    skip: tuple[str, ...] = ()
    seen: dict[str, tuple[int, str]] = field(default_factory=dict)

    def fill(self, groups: list[dict[str, Any]], frames: Mapping[int, Any]) -> None:
        for group in groups:
            key, seq = group["pg"], group["entered"]
            known = self.seen.get(key)
            if known is None or known[0] != seq:
                site = ""
                if group["entered"] > group["done"] and group.get("thread"):
                    with contextlib.suppress(ValueError):
                        frame = frames.get(int(group["thread"]))
                        site = site_of(user_frame(frames_of(frame), self.skip))
                known = (seq, site)
                self.seen[key] = known
            group["site"] = known[1]


class Watcher:
    """The thread (see the module docstring); :meth:`start` it, :meth:`stop` it at the end."""

    def __init__(self, *, rank: int, world_size: int, node: str, settings: HangSettings,
                 connect: Callable[[], Any], environ: Mapping[str, str],
                 err_fd: int = 2, job: Mapping[str, Any] | None = None,
                 measure_waits: bool = False) -> None:
        self.rank, self.world_size, self.node = rank, world_size, node
        self.settings = settings
        self._connect = connect
        self.error_file = environ.get(ERROR_FILE_VAR, "")
        self._environ = environ
        self.err_fd = err_fd
        self._stop = threading.Event()
        self._finished = False
        self._answered = 0
        self._sites = _Sites()
        self._torch_seen = False
        self._base_prefixes = base_prefixes()  # here: the thread must import nothing
        self._thread = threading.Thread(target=self._run_timed, name=THREAD_NAME, daemon=True)
        #: this rank's time in collectives (:mod:`unirank.hang.waits`; None: not measured,
        #: nothing gathers it), and the thread's cost
        self.waits = WaitMeter() if measure_waits else None
        self.cpu_s = self.life_s = 0.0
        self.ticks = 0
        self.detector: _Detector | None = None
        #: whether this rank runs the detector now (rank 0, or a standby: hang/standby.py)
        self._duty = Duty(rank)
        self._on_duty = rank == 0
        self._store: Any = None
        #: this node's job file for ``unirank stacks`` (:mod:`unirank.hang.jobs`), if any
        self._job = job
        self._job_file: str | None = None
        #: the last record published that showed this rank waiting in a collective
        self._last_waiting: dict[str, Any] | None = None
        #: the program failed in a collective: no more records (the waiting one stays), and
        #: its main thread's stack is the failure's traceback
        self._held = False
        self._failed_frames: list[list[Any]] | None = None

    def attempt_folder(self) -> str:
        """The attempt's folder (the error file's ``<attempt>/<local rank>/error.json``), or ""
        where no error file is named (not started by ``unirank run``)."""
        error_file = self.error_file
        return os.path.dirname(os.path.dirname(error_file)) if error_file else ""

    def start(self) -> Watcher:
        """Turn the flight recorder on (:func:`enable_recorder`), connect to the store (here:
        the connection imports what it needs before the program runs), then start the thread
        (once per process: see :func:`running`). Without a store there is no detector, and the
        program goes on."""
        enable_recorder(self._environ)
        try:
            self._store = self._connect()
        except Exception:
            return self
        _RUNNING.append(self)
        if self._job is not None:
            self._job_file = announce({**self._job, "world_size": self.world_size,
                                       "interval": self.settings.interval})
        self._thread.start()
        # before the interpreter's teardown: a daemon thread inside a store call at that
        # moment aborts the process ("terminate called without an active exception")
        atexit.register(self.stop)
        return self

    def reconfigure(self, settings: HangSettings) -> None:
        """Take the settings the program gave :func:`unirank.init` (its keywords win over the
        variables the bootstrap started this watcher with); ``off`` stops it."""
        if settings.report_after is None:
            self.stop(finished=False)
            return
        self.settings = settings

    def stop(self, *, finished: bool = True, timeout: float = 2.0) -> None:
        """End the thread (it publishes a last record saying the program ended); waits for it
        at most ``timeout`` seconds."""
        self._finished = finished
        self._stop.set()
        if self in _RUNNING:
            _RUNNING.remove(self)
        withdraw(self._job_file)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # -- the thread ---------------------------------------------------------------------
    def _run(self) -> None:
        keep_off_this_thread()  # the program's signals go to its main thread
        store = self._store
        if self._duty.stands_by:
            self.detector = _Detector(self, store)
        while True:
            try:
                self._tick(store)
            except _JobEnding as ending:
                self._end(str(ending))  # rank 0 ends the job (--hang-timeout): so does this rank
            except Exception:
                return  # the store went away (the job is ending): no more records
            if self._look_until_next_tick():
                break
        with contextlib.suppress(Exception):
            self._publish(store)

    def _run_timed(self) -> None:
        """:meth:`_run`, with the thread's own CPU time and life kept (:meth:`end_record`)."""
        started, born = time.thread_time(), time.monotonic()
        try:
            self._run()
        finally:
            self.cpu_s = time.thread_time() - started
            self.life_s = time.monotonic() - born

    def _look_until_next_tick(self) -> bool:
        """Between two records: look at the collectives in flight every
        :data:`~unirank.hang.waits.SAMPLE_PERIOD` seconds (:class:`WaitMeter`), until the
        next record is due; True when the watcher is stopped."""
        self.ticks += 1
        if self.waits is None:
            return self._stop.wait(self.settings.interval)
        due = time.monotonic() + self.settings.interval
        while not self._stop.is_set():
            now = time.monotonic()
            self.waits.look(now, recorder_status())
            if now >= due:
                return False
            if self._stop.wait(min(SAMPLE_PERIOD, due - now)):
                break
        return True

    def end_record(self) -> dict[str, Any]:
        """What this rank adds to its end-of-run record (:mod:`unirank.supervisor.worker.
        timeline`): its time in collectives, and what the thread cost (CPU seconds, over how
        many seconds, records)."""
        record: dict[str, Any] = {"watcher": {"cpu_s": round(self.cpu_s, 6),
                                              "life_s": round(self.life_s, 3),
                                              "ticks": self.ticks}}
        if self.waits is not None:
            record["collectives"] = {**self.waits.summary(), "interval": self.settings.interval}
        return record

    def _tick(self, store: Any) -> None:
        self._publish(store)
        self._answer(store)
        if self.detector is not None and self._check_duty(store):
            self.detector.tick(time.time())

    def _check_duty(self, store: Any) -> bool:
        """Whether this rank runs the detector now; a standby says when it takes over."""
        if self.rank == 0:
            return True
        keys = {r: progress_key(r) for r in self._duty.lower_ranks()}
        records = {r: (json.loads(bytes(store.get(k))) if store.check([k]) else None)
                   for r, k in keys.items()}
        on_duty = self._duty.on_duty(records, time.monotonic(), self.settings.interval)
        if on_duty and not self._on_duty:
            silent = silent_after(self.settings.interval)
            lower = "rank 0 has" if self.rank == 1 else f"ranks 0-{self.rank - 1} have"
            with contextlib.suppress(OSError):
                os.write(self.err_fd, (f"unirank: {lower} sent no progress record for "
                                       f"{silent:g} s (frozen, or its interpreter is held): "
                                       f"rank {self.rank} looks for hangs instead\n").encode())
        self._on_duty = on_duty
        return on_duty

    def record(self) -> dict[str, Any]:
        """This rank's progress record now."""
        if not self._sites.skip or ("torch" in sys.modules) != self._torch_seen:
            self._torch_seen = "torch" in sys.modules
            self._sites.skip = library_prefixes(self._base_prefixes)
        dump = _read_recorder()
        groups = group_progress(dump, self.world_size) if dump else []
        frames = sys._current_frames()
        self._sites.fill(groups, frames)
        main = threading.main_thread().ident
        stack = frames_of(frames.get(main or -1))
        mine = user_frame(stack, self._sites.skip)
        where = site_of(mine, with_function=True)
        waits = waits_for(stack, mine)
        if where and waits:
            where += f", waiting for {waits}"
        return make_record(self.rank, self.node, time.time(), groups, where,
                           finished=self._finished and self._stop.is_set(),
                           recorder=dump is not None)

    def _publish(self, store: Any) -> None:
        if self._held:
            return
        record = self.record()
        store.set(progress_key(self.rank), json.dumps(record))
        if any(g["entered"] > g["done"] for g in record["groups"]):
            self._last_waiting = record

    def stacks(self) -> list[dict[str, Any]]:
        """Every thread's stack but the watcher's, trimmed of the frames before the user's."""
        names = {t.ident: t.name for t in threading.enumerate() if t.ident is not None}
        threads = thread_stacks(sys._current_frames(), names, self._thread.ident)
        for thread in threads:
            if thread["name"] == "MainThread" and self._failed_frames is not None:
                thread["frames"] = self._failed_frames
            frames = thread["frames"]
            outer = next((i for i, f in enumerate(frames)
                          if user_frame([tuple(f)], self._sites.skip) is not None), None)
            if outer:
                thread["frames"] = frames[outer:]
        return threads

    def answer(self, store: Any, number: int) -> None:
        """Set this rank's stacks for stack request ``number``."""
        payload = {"rank": self.rank, "node": self.node, "threads": self.stacks()}
        store.set(f"{STACKS_PREFIX}{number}/{self.rank}", json.dumps(payload))
        self._answered = max(self._answered, number)

    def _answer(self, store: Any) -> None:
        number = int(store.add(ASK_KEY, 0))
        if number >= ENDING:
            reason = bytes(store.get(REASON_KEY)).decode(errors="replace")
            store.add(ENDED_KEY, 1)
            raise _JobEnding(reason)
        for pending in range(max(self._answered + 1, number - 3), number + 1):
            self.answer(store, pending)

    def failure_report(self, exc: BaseException) -> str | None:
        """An exception left the program (see :mod:`unirank.hang.onstop`): when it was raised
        inside torch.distributed and this rank's last record, at most two intervals old,
        showed it waiting in a collective, hold that record, print the hang's report if this
        rank is the first to fail so (the others wait for it, a bounded time), and return the
        hang's wavefront (None: no hang)."""
        waiting = self._last_waiting
        interval = self.settings.interval
        if (isinstance(exc, SystemExit) or waiting is None or self._held
                or time.time() - float(waiting["time"]) > 2 * interval + 1):
            return None
        frames = _traceback_frames(exc)
        if not any("/torch/distributed/" in f[0].replace(os.sep, "/") for f in frames):
            return None  # not raised inside a collective
        self._held = True
        self._failed_frames = [list(f) for f in frames]
        from unirank.hang.onstop import answer_within, report_now
        from unirank.hang.render import wavefront_line

        store = self._store  # its ops are serialised with the thread's; a gone store fails fast
        try:
            store.set(progress_key(self.rank), json.dumps(waiting))
            records = read_records(store, self.world_size)
            if int(store.add(FAILED_KEY, 1)) > 1:
                hangs = find_hangs(records, self.world_size, interval, time.time())
                self._await_report(store, time.monotonic() + answer_within(interval) + 2)
                return wavefront_line(hangs[0]) if hangs else None
            try:
                made = report_now(store, self.world_size, interval, records=records, own=self,
                                  cause=f"a collective failed: {type(exc).__name__}")
            finally:
                store.set(REPORTED_KEY, "1")
        except Exception:  # the store is gone: the job ends anyway
            return None
        if made is None:
            return None
        with contextlib.suppress(OSError):
            os.write(self.err_fd, made[0].encode(errors="replace"))
        return wavefront_line(made[1][0])

    def _await_report(self, store: Any, deadline: float) -> None:
        """Until the first failing rank has printed its report (or ``deadline``), answering
        its stack request at once (never holding the connection for long: the thread shares
        it)."""
        with contextlib.suppress(Exception):
            while not store.check([REPORTED_KEY]) and time.monotonic() < deadline:
                self._answer(store)
                time.sleep(0.05)

    def exit_for_timeout(self, store: Any, message: str) -> None:
        """Record the hang as this rank's failure, have every other rank end (each on its
        next interval: its thread stops using the store, records why and exits, so that ranks
        under other supervisors end too), and end this process (``--hang-timeout``) once they
        have, at most two intervals and a second later (a frozen rank does not answer)."""
        self._record(message)
        with contextlib.suppress(Exception):
            store.set(REASON_KEY, f"rank {self.rank} ended the job: {message}")
            store.add(ASK_KEY, ENDING)
            deadline = time.monotonic() + 2 * self.settings.interval + 1
            while (int(store.add(ENDED_KEY, 0)) < self.world_size - 1
                   and time.monotonic() < deadline):
                self._stop.wait(0.05)
        withdraw(self._job_file)
        os._exit(HANG_EXIT_CODE)

    def _record(self, message: str) -> None:
        from unirank.errorfile import record_exception

        if self.error_file:
            record_exception(HangTimeoutError(message), {ERROR_FILE_VAR: self.error_file},
                             exit_code=HANG_EXIT_CODE)

    def _end(self, message: str) -> None:
        """Another rank's part of :meth:`exit_for_timeout`: record why, give rank 0 (the
        root cause) the time to end first, then end (ranks under another supervisor)."""
        self._record(message)
        withdraw(self._job_file)
        self._stop.wait(2 * self.settings.interval + 3)
        os._exit(HANG_EXIT_CODE)


class _Detector:
    """Rank 0's part: gather every record, find hangs, report with a doubling interval."""

    def __init__(self, watcher: Watcher, store: Any) -> None:
        self.watcher = watcher
        self.store = store
        self.current: tuple[tuple[str, int], ...] = ()
        self.number = 0
        self.next_at = 0.0
        settings = watcher.settings
        assert settings.report_after is not None
        self.report_after = settings.report_after
        self.answer_timeout = 2 * settings.interval + 3.0

    def records(self) -> dict[int, dict[str, Any] | None]:
        """Every rank's last record (None: it set none yet)."""
        return read_records(self.store, self.watcher.world_size)

    def tick(self, now: float) -> None:
        settings = self.watcher.settings  # :meth:`Watcher.reconfigure` may change them
        if settings.report_after is not None:
            self.report_after = settings.report_after
            self.answer_timeout = 2 * settings.interval + 3.0
        records = self.records()
        self._mark_waiting(bool(find_hangs(records, self.watcher.world_size, settings.interval,
                                           now)))
        hangs = find_hangs(records, self.watcher.world_size, self.report_after, now)
        key = tuple((h.pg, h.seq) for h in hangs)
        if key != self.current:
            self.current, self.number, self.next_at = key, 0, self.report_after
        if not hangs:
            return
        waited = max(h.waited for h in hangs)
        limit = self.watcher.settings.timeout
        ending = limit is not None and waited >= limit
        if waited < self.next_at and not ending:
            return
        self.number += 1
        self.next_at = max(self.next_at, waited) * 2
        self.report(hangs, ending=ending)

    def ask(self) -> tuple[dict[int, list[dict[str, Any]]], list[int], dict[int, str]]:
        """Every rank's stacks (rank 0's own at once), those that did not answer in time, and
        the nodes the answers came from."""
        return request_stacks(self.store, self.watcher.world_size, self.answer_timeout,
                              own=self.watcher)

    def report(self, hangs: list[Hang], *, ending: bool) -> None:
        stacks, missing, nodes = self.ask()
        for hang in hangs:
            nodes.update({r: n for r, n in hang.nodes.items() if n})
        files = self._dump_files()
        limit = self.watcher.settings.timeout
        last = (f"ending the job (--hang-timeout {limit:g} s, exit code {HANG_EXIT_CODE})"
                if ending else "")
        text = render_report(hangs, stacks, unanswered=missing, number=self.number,
                             report_after=self.report_after, nodes=nodes,
                             answer_timeout=self.answer_timeout, dump_files=files,
                             ending=last)
        self._write_dump(files, text, stacks, hangs)
        with contextlib.suppress(OSError):
            os.write(self.watcher.err_fd, text.encode(errors="replace"))
        if ending:
            self._write_verdict(hangs[0])
            self.watcher.exit_for_timeout(self.store, f"no progress for {limit:g} s "
                                          f"(--hang-timeout): {wavefront_line(hangs[0])}")

    def _write_verdict(self, hang: Hang) -> None:
        """The hang's :func:`~unirank.hang.detect.verdict` in the attempt's folder, for the
        supervisor (``--on-hang evict``)."""
        folder = self.watcher.attempt_folder()
        with contextlib.suppress(OSError):
            if folder:
                with open(os.path.join(folder, HANG_VERDICT), "w", encoding="utf-8") as fh:
                    json.dump(verdict(hang), fh)

    def _mark_waiting(self, waiting: bool) -> None:
        """Keep the attempt folder's :data:`~unirank.hang.WAITING_MARK` while some rank has
        waited one interval (the supervisor's sign to ask for the report at a stop); at every
        look, so that a standby's mark does not outlive its duty."""
        folder = self.watcher.attempt_folder()
        if not folder:
            return
        path = os.path.join(folder, WAITING_MARK)
        with contextlib.suppress(OSError):
            if not waiting:
                os.unlink(path)
            elif not os.path.exists(path):
                with open(path, "w", encoding="utf-8"):
                    pass

    def _dump_files(self) -> list[str]:
        folder = self.watcher.attempt_folder()
        if not folder:
            return []
        folder = os.path.join(folder, HANG_FOLDER)
        stem = os.path.join(folder, f"report-{self.number}")
        return [f"{stem}.txt", f"{stem}.json"]

    def _write_dump(self, files: list[str], text: str,
                    stacks: Mapping[int, list[dict[str, Any]]], hangs: list[Hang]) -> None:
        if not files:
            return
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(files[0]), exist_ok=True)
            per_rank = [f"rank {rank}:\n" + "".join(
                f"  Thread {t['name']}:\n" + "".join(
                    f'    File "{p}", line {n}, in {fn}\n' + (f"      {src}\n" if src else "")
                    for p, n, fn, src in t["frames"]) for t in threads)
                for rank, threads in sorted(stacks.items())]
            with open(files[0], "w", encoding="utf-8") as fh:
                fh.write(text + "\nevery rank's stack:\n" + "".join(per_rank))
            with open(files[1], "w", encoding="utf-8") as fh:
                json.dump({"report": text, "hangs": [_hang_json(h) for h in hangs],
                           "stacks": {str(r): s for r, s in stacks.items()}}, fh, indent=1)


def read_records(store: Any, world_size: int) -> dict[int, dict[str, Any] | None]:
    """Every rank's last progress record (None: it set none yet): one ``multi_get`` when all
    are there."""
    keys = [progress_key(r) for r in range(world_size)]
    if store.check(keys):
        return {r: json.loads(bytes(v)) for r, v in enumerate(store.multi_get(keys))}
    return {r: (json.loads(bytes(store.get(k))) if store.check([k]) else None)
            for r, k in enumerate(keys)}


def request_stacks(store: Any, world_size: int, timeout: float, *, own: Watcher | None = None
                   ) -> tuple[dict[int, list[dict[str, Any]]], list[int], dict[int, str]]:
    """Ask every rank's watcher for its stacks (``own``: answer for this process at once) and
    wait for them at most ``timeout`` seconds: the stacks by rank, the ranks that did not
    answer, and the nodes of those that did."""
    number = int(store.add(ASK_KEY, 1))
    if own is not None:
        own.answer(store, number)
    keys = {r: f"{STACKS_PREFIX}{number}/{r}" for r in range(world_size)}
    with contextlib.suppress(Exception):
        store.wait(list(keys.values()), timedelta(seconds=timeout))
    stacks: dict[int, list[dict[str, Any]]] = {}
    nodes: dict[int, str] = {}
    for rank, key in keys.items():
        if store.check([key]):
            answer = json.loads(bytes(store.get(key)))
            stacks[rank] = answer["threads"]
            nodes[rank] = answer.get("node", "")
    return stacks, [r for r in keys if r not in stacks], nodes


def _traceback_frames(exc: BaseException) -> list[tuple[str, int, str, str]]:
    """The frames of ``exc``'s traceback, outermost first, as a stack's frames."""
    import traceback

    return [(f.filename, f.lineno or 0, f.name, (f.line or "").strip())
            for f in traceback.extract_tb(exc.__traceback__)]


def add_hang_note(exc: BaseException, wavefront: str | None) -> None:
    """Add the hang's wavefront to ``exc`` as a note (its traceback and error record show
    it)."""
    if not wavefront:
        return
    note = f"unirank: the ranks hung: {wavefront}"
    notes = getattr(exc, "__notes__", None)
    with contextlib.suppress(AttributeError, TypeError):
        if isinstance(notes, list):
            notes.append(note)
        else:
            exc.__notes__ = [note]


def excepthook_with_report(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook`` (an excepthook), after this process's watcher had its say about the exception
    (:meth:`Watcher.failure_report`), which it gets as a note."""

    def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> Any:
        watcher = running()
        if watcher is not None and isinstance(value, BaseException):
            add_hang_note(value, watcher.failure_report(value))
        return hook(kind, value, tb)

    return excepthook


def _hang_json(hang: Hang) -> dict[str, Any]:
    from dataclasses import asdict

    data = asdict(hang)
    data["nodes"] = {str(k): v for k, v in hang.nodes.items()}
    return data
