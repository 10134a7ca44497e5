"""The thread each rank runs for the hang detector (``unirank-hang-watch``, a daemon): thin.

Every interval it makes this rank's progress record (the flight recorder read by
:class:`~unirank.hang.recorder.Recorder`; a torch without the private
``_dump_fr_trace_json`` gives "no progress information", never an error), sets it in the
job's store (:mod:`unirank.hang.exchange`: one ``set`` of one key), and checks one counter
(``add(key, 0)``) that asks every rank for its Python stacks: then it sets them (every
thread's, from :func:`sys._current_frames`, read by this thread: no signal is taken, no code
runs in a signal handler). On rank 0 (or a standby while rank 0 is silent:
:mod:`unirank.hang.standby`) it also runs :class:`unirank.hang.detector.Detector`. When the
detector's rank ends the job (``--hang-timeout``), every rank's thread records why, in the
order :mod:`unirank.hang.ending` says, and ends its process with
:data:`unirank.exitcodes.HANG_TIMEOUT`.

Where asked (``measure_waits``: a worker of ``unirank run``, whose rank 0 gathers it), it
looks at the groups' status every 50 ms between two records, to measure the rank's time in
collectives (:mod:`unirank.hang.waits`); :meth:`Watcher.end_record` gives that, with the
thread's own CPU time, to the rank's end-of-run record. There it also keeps the attempt
folder's mark of a rank that waits in one collective (:class:`~unirank.hang.waits.
CollectiveMark`), for its supervisor when a node is gone. While a live view watches
(``unirank top``), it also sets the rank's live record every second (:mod:`unirank.hang.live`).

The thread uses a store connection of its own, so it never waits behind the program's or
torch's use of the store. When an exception leaves the program, :func:`unirank.hang.failure.
failure_report` has its say (:meth:`Watcher.failure_report`); :func:`excepthook_with_report`
calls it where no worker bootstrap does (:func:`unirank.init` under srun, mpirun, torchrun).

Reads: TORCHELASTIC_ERROR_FILE (where this rank records a hang timeout), UNIRANK_ATTEMPT_DIR
(the attempt folder that holds the dumps), TORCHELASTIC_RESTART_COUNT (the live record's),
GROUP_RANK (the record's node rank, which tells apart two nodes of one host).
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
from dataclasses import replace
from typing import Any

from unirank.contract import ERROR_FILE_VAR, HangSettings
from unirank.exitcodes import HANG_TIMEOUT
from unirank.hang.children import arm as arm_children
from unirank.hang.children import child_stacks
from unirank.hang.detector import Detector
from unirank.hang.ending import (
    ENDING,
    REASON_KEY,
    Ending,
    announce_ending,
    end_in_turn,
    failure_of,
)
from unirank.hang.exchange import (
    ASK_KEY,
    progress_key,
    stacks_key,
)
from unirank.hang.failure import add_hang_note, failure_report
from unirank.hang.jobs import announce, withdraw
from unirank.hang.live import Live, restart_of
from unirank.hang.phases import current as current_phase
from unirank.hang.progress import (
    base_prefixes,
    frames_of,
    group_progress,
    library_prefixes,
    make_record,
    other_threads_frames,
    site_of,
    thread_stacks,
    trim_to_user,
    user_frame,
    waits_for,
)
from unirank.hang.recorder import (
    Recorder,
    Sites,
    enable_recorder,
)
from unirank.hang.slowrank import read_named
from unirank.hang.standby import Duty, takeover_line
from unirank.hang.straggle import Straggler
from unirank.hang.timings import LINGER
from unirank.hang.waits import SAMPLE_PERIOD, CollectiveMark, WaitMeter, recorder_status
from unirank.runfolder import AttemptFolder
from unirank.signals import start_shielded

__all__ = ["THREAD_NAME", "Watcher", "excepthook_with_report", "running"]

THREAD_NAME = "unirank-hang-watch"


class _JobEnding(Exception):
    """Rank 0 ends the job: this rank's thread stops."""


_RUNNING: list[Watcher] = []


def _node_rank(environ: Mapping[str, str]) -> int | None:
    """torchrun's GROUP_RANK (this rank's node's rank), None where no launcher says it."""
    try:
        return int(environ.get("GROUP_RANK", ""))
    except ValueError:
        return None


def running() -> Watcher | None:
    """This process's watcher, if one was started (a worker's bootstrap starts it; then
    :func:`unirank.init` does not start another)."""
    return _RUNNING[-1] if _RUNNING else None


class Watcher:
    """The thread (see the module docstring); :meth:`start` it, :meth:`stop` it at the end."""

    def __init__(self, *, rank: int, world_size: int, node: str, settings: HangSettings,
                 connect: Callable[[], Any], environ: Mapping[str, str],
                 err_fd: int = 2, job: Mapping[str, Any] | None = None,
                 measure_waits: bool = False) -> None:
        self.rank, self.world_size, self.node = rank, world_size, node
        self.group = _node_rank(environ)
        self.settings = settings
        self._connect = connect
        self.error_file = environ.get(ERROR_FILE_VAR, "")
        self._environ = environ
        self.err_fd = err_fd
        self._stop = threading.Event()
        self._finished = False
        self._answered = 0
        self._sites = Sites()
        self._recorder = Recorder()
        self._torch_seen = False
        self._base_prefixes = base_prefixes()  # here: the thread must import nothing
        self._thread = threading.Thread(target=self._run_timed, name=THREAD_NAME, daemon=True)
        #: this rank's time in collectives (:mod:`unirank.hang.waits`; None: not measured,
        #: nothing gathers it), and the thread's cost
        self.waits = WaitMeter() if measure_waits else None
        self._live = Live(rank, restart_of(environ))
        folder = self.attempt_folder()
        #: kept while this rank waits in one collective (where the waits are measured)
        self._mark = CollectiveMark(AttemptFolder(folder).collective_mark(rank) if folder
                                    else "")
        self.cpu_s = self.life_s = 0.0
        self.ticks = 0
        self.detector: Detector | None = None
        #: whether this rank runs the detector now (rank 0, or a standby: hang/standby.py)
        self._duty = Duty(rank)
        self._on_duty = rank == 0
        self.store: Any = None
        #: this node's job file for ``unirank stacks`` (:mod:`unirank.hang.jobs`), if any
        self._job = job
        self._job_file: str | None = None
        #: the last record published that showed this rank waiting in a collective
        self.last_waiting: dict[str, Any] | None = None
        #: the program failed in a collective: no more records (the waiting one stays), and
        #: its main thread's stack is the failure's traceback
        self.held = False
        self._failed_frames: list[list[Any]] | None = None
        #: the hang timeout ends the job (its report was made): under a learned one, a failed
        #: collective adds none (:mod:`unirank.hang.failure`)
        self.ending = False

    def attempt_folder(self) -> str:
        """The attempt's folder as the worker was told it (:func:`unirank.runfolder.
        attempt_folder_of`), or "" (plain python: no folder)."""
        from unirank.runfolder import attempt_folder_of

        return attempt_folder_of(self._environ)

    def stragglers(self) -> tuple[Straggler, ...]:
        """The stragglers named now (:mod:`unirank.hang.slowrank`): what the store holds
        (:func:`~unirank.hang.slowrank.read_named`), where whichever rank runs the detector
        puts them before it says them: the same on every rank, also on a standby that took the
        detector over because rank 0's program ended (its own detector has named no one)."""
        return read_named(self.store)

    def write_verdict(self, found: dict[str, Any] | None) -> None:
        """A hang's :func:`~unirank.hang.detect.verdict` in the attempt's folder, for this
        node's supervisor (``--on-hang evict``); nothing without a verdict or a folder."""
        folder = self.attempt_folder()
        if found is None or not folder:
            return
        path = AttemptFolder(folder).hang_verdict
        with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as fh:
            json.dump(found, fh)

    def start(self) -> Watcher:
        """Turn the flight recorder on (:func:`enable_recorder`), connect to the store (here:
        the connection imports what it needs before the program runs), then start the thread
        (once per process: see :func:`running`). Without a store there is no detector, and the
        program goes on."""
        enable_recorder(self._environ)
        arm_children()  # before the program forks its DataLoader workers
        try:
            self.store = self._connect()
        except Exception:
            return self
        _RUNNING.append(self)
        if self._job is not None:
            folder = self.attempt_folder()
            run = AttemptFolder(folder).run if folder else None
            self._job_file = announce({**self._job, "world_size": self.world_size,
                                       "interval": self.settings.interval,
                                       "report_after": self.settings.report_after,
                                       "spares_file": run and run.spares_file,
                                       "evicted_file": run and run.evicted_file,
                                       "slow_link_file": run and run.slow_link_file})
        start_shielded(self._thread)  # the program's signals go to its main thread
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
        # --on-slow is the supervisor's word for this attempt (its variable is gone by now)
        self.settings = replace(settings, on_slow=self.settings.on_slow)

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
        store = self.store
        if self._duty.stands_by:
            self.detector = Detector(self, store)
        while True:
            try:
                self._tick(store)
            except _JobEnding as ending:
                self._end(store, Ending.decode(str(ending)))  # --hang-timeout: this rank ends
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
        period = self._live.period(None if self.waits is None else SAMPLE_PERIOD)
        if period is None:
            return self._stop.wait(self.settings.interval)
        due = time.monotonic() + self.settings.interval
        while not self._stop.is_set():
            now = time.monotonic()
            status = None
            if self.waits is not None:
                self.waits.look(now, status := recorder_status(exact=self.waits.to_confirm(now)))
                self._mark.update(self.waits.waiting_for(now))
            self._live.look(self.store, now, self.waits, status)
            if now >= due:
                return False
            if self._stop.wait(min(period, due - now)):
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
        self._live.tick(store)
        self._publish(store)
        self.answer_pending(store)
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
        if on_duty != self._on_duty and self.detector is not None:
            self.detector.standby_note = takeover_line(self.rank, self.settings.interval) \
                if on_duty else ""
            if on_duty:
                self.detector.take_over()
        self._on_duty = on_duty
        return on_duty

    def record(self, *, fresh: bool = False) -> dict[str, Any]:
        """This rank's progress record now (``fresh``: with the recorder's entries read now)."""
        if not self._sites.skip or ("torch" in sys.modules) != self._torch_seen:
            self._torch_seen = "torch" in sys.modules
            self._sites.skip = library_prefixes(self._base_prefixes)
        dump = self._recorder.read(last=fresh or self._stop.is_set())
        groups = group_progress(dump, self.world_size) if dump else []
        frames = other_threads_frames()
        self._sites.fill(groups, frames)
        main = threading.main_thread().ident
        stack = frames_of(frames.get(main or -1))
        mine = user_frame(stack, self._sites.skip)
        where = site_of(mine, with_function=True)
        waits = waits_for(stack, mine)
        if where and waits:
            where += f", waiting for {waits}"
        return make_record(self.rank, self.node, time.time(), groups, where, group=self.group,
                           finished=self._finished and self._stop.is_set(),
                           recorder=dump is not None, phase=current_phase())

    def _publish(self, store: Any) -> None:
        if self.held:
            return
        record = self.record()
        # the process's CPU seconds but this thread's: does the rank compute (hang/learned.py)
        record["cpu"] = round(time.process_time() - time.thread_time(), 4)
        self._live.stamp(record, self.waits)
        store.set(progress_key(self.rank), json.dumps(record))
        self._live.publish(store, record, self.waits)
        if any(g["entered"] > g["done"] for g in record["groups"]):
            self.last_waiting = record

    def stacks(self) -> list[dict[str, Any]]:
        """Every thread's stack but the watcher's, and the forked children's while the main
        thread waits for a DataLoader worker, trimmed of the frames before the user's."""
        names = {t.ident: t.name for t in threading.enumerate() if t.ident is not None}
        threads = thread_stacks(other_threads_frames(), names, self._thread.ident)
        for thread in threads:
            if thread["name"] == "MainThread" and self._failed_frames is not None:
                thread["frames"] = self._failed_frames
            main = [tuple(f) for f in thread["frames"]] if thread["name"] == "MainThread" else []
            if main and waits_for(main, user_frame(main, self._sites.skip)):
                threads += child_stacks()
        return trim_to_user(threads, self._sites.skip)

    def answer(self, store: Any, number: int) -> None:
        """Set this rank's stacks for stack request ``number``."""
        payload = {"rank": self.rank, "node": self.node, "threads": self.stacks()}
        store.set(stacks_key(number, self.rank), json.dumps(payload))
        self._answered = max(self._answered, number)

    def answer_pending(self, store: Any) -> None:
        """Answer the stack requests not answered yet; raises when the job ends."""
        number = int(store.add(ASK_KEY, 0))
        if number >= ENDING:
            raise _JobEnding(bytes(store.get(REASON_KEY)).decode(errors="replace"))
        for pending in range(max(self._answered + 1, number - 3), number + 1):
            self.answer(store, pending)

    def failure_report(self, exc: BaseException) -> str | None:
        """:func:`unirank.hang.failure.failure_report` for this rank."""
        return failure_report(self, exc)

    def hold(self, frames: list[list[Any]]) -> None:
        """The program failed in a collective: publish no more records (the waiting one
        stays), and show ``frames`` (the failure's traceback) as the main thread's stack."""
        self.held = True
        self._failed_frames = frames

    def exit_for_timeout(self, store: Any, ending: Ending) -> None:
        """End the job (``--hang-timeout``): tell every rank why and whom to blame, then end
        as they do (:meth:`_end`)."""
        with contextlib.suppress(Exception):
            announce_ending(store, ending)
        self._end(store, ending)

    def _record(self, failure: BaseException) -> None:
        from unirank.errorfile import record_exception

        if self.error_file:  # the first record wins: a second call changes nothing
            record_exception(failure, {ERROR_FILE_VAR: self.error_file},
                             exit_code=HANG_TIMEOUT)

    def _end(self, store: Any, ending: Ending) -> None:
        """Every rank's part of the ending (:func:`~unirank.hang.ending.end_in_turn`), then
        this process ends with :data:`~unirank.exitcodes.HANG_TIMEOUT`."""
        self.ending = True
        linger = LINGER.of(self.settings.interval)

        def record(message: str) -> None:
            self._record(failure_of(ending, message))

        with contextlib.suppress(Exception):
            linger = end_in_turn(store, self.rank, self.world_size, self.settings.interval,
                                 ending, record, self._stop.wait)
        record(ending.message)
        self.write_verdict(ending.verdict)  # every node's supervisor reads the same verdict
        withdraw(self._job_file)
        if linger:
            self._stop.wait(linger)
        os._exit(HANG_TIMEOUT)


def excepthook_with_report(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook`` (an excepthook), after this process's watcher had its say about the exception
    (:func:`~unirank.hang.failure.failure_report`), which it gets as a note."""

    def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> Any:
        watcher = running()
        if watcher is not None and isinstance(value, BaseException):
            add_hang_note(value, watcher.failure_report(value))
        return hook(kind, value, tb)

    return excepthook
