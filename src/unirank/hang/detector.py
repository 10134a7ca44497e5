"""The detector's part of the watcher thread (rank 0, or a standby): every record read,
the hangs found (:func:`unirank.hang.detect.find_hangs`), the reports made when
:func:`unirank.hang.schedule.decide` says so (printed on rank 0's stderr, written with every
rank's stacks as text and JSON in the attempt's ``hang/`` folder), the ranks-waiting mark kept
for the supervisor, the stragglers named while the job runs (:mod:`unirank.hang.slowrank`: a
line each on rank 0's stderr), and the job ended at ``--hang-timeout`` (fixed, or learned:
:mod:`unirank.hang.learned`, where only stuck ranks end it).

Reads no environment variable.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from typing import Any, Protocol

from unirank.contract import HANG_TIMEOUT_AUTO, HangSettings, shown_setting
from unirank.exitcodes import HANG_TIMEOUT
from unirank.hang.detect import Hang, blame, find_hangs, verdict
from unirank.hang.ending import Ending
from unirank.hang.exchange import read_records, request_stacks
from unirank.hang.learned import SILENT, Learned, Stuck, observe, timeout_now, verdict_now
from unirank.hang.render import changed_ranks, render_report, timeout_message
from unirank.hang.schedule import Decision, Schedule, decide
from unirank.hang.slowcost import slow_verdict, to_evict
from unirank.hang.slowrank import Slow, change_line, encode_named, read_named
from unirank.hang.slowrank import observe as observe_slow
from unirank.hang.timings import ANSWER
from unirank.runfolder import AttemptFolder, read_spares
from unirank.storekeys.hang import STRAGGLERS_KEY


class Watcher(Protocol):
    """What the detector uses of its rank's watcher (:class:`unirank.hang.watcher.Watcher`)."""

    settings: HangSettings
    rank: int
    world_size: int
    err_fd: int

    def attempt_folder(self) -> str: ...

    def answer(self, store: Any, number: int) -> None: ...

    def exit_for_timeout(self, store: Any, ending: Ending) -> None: ...

    def write_verdict(self, found: dict[str, Any] | None) -> None: ...

__all__ = ["Detector"]


class Detector:
    """Rank 0's part: gather every record, find hangs, report with a doubling interval."""

    def __init__(self, watcher: Watcher, store: Any) -> None:
        self.watcher = watcher
        self.store = store
        self.schedule = Schedule()
        settings = watcher.settings
        assert settings.report_after is not None
        self.report_after = settings.report_after
        self.answer_timeout = ANSWER.of(settings.interval)
        #: the stacks of the hang's full report (the later, short ones say what changed)
        self.first_stacks: dict[int, list[dict[str, Any]]] = {}
        #: a standby's line (why it reports, not rank 0), printed with its first report only:
        #: a rank 0 held a while under load, with nothing to report, is no news
        self.standby_note = ""
        #: what the learned timeout learned (:mod:`unirank.hang.learned`), the ranks it ends
        #: the job for
        self.learned = Learned()
        self.stuck: tuple[Stuck, ...] = ()
        #: the stragglers rule's state (:mod:`unirank.hang.slowrank`)
        self.slow = Slow()
        #: ``--on-slow evict`` ended the job (:meth:`_evict_slow`)
        self.evicting = False

    def take_over(self) -> None:
        """This rank goes on duty (a standby, rank 0 gone quiet): it starts from the ranks the
        store names, so that it says when they recover rather than leaving their names there."""
        with contextlib.suppress(Exception):  # the store going away: nothing to start from
            self.slow = Slow(named={s.rank: s for s in read_named(self.store)})

    def records(self) -> dict[int, dict[str, Any] | None]:
        """Every rank's last record (None: it set none yet)."""
        return read_records(self.store, self.watcher.world_size)

    def tick(self, now: float) -> None:
        settings = self.watcher.settings  # :meth:`Watcher.reconfigure` may change them
        if settings.report_after is not None:
            self.report_after = settings.report_after
            self.answer_timeout = ANSWER.of(settings.interval)
        records = self.records()
        waiting = bool(find_hangs(records, self.watcher.world_size, settings.interval, now))
        self._mark_waiting(waiting)
        self._stragglers(records, waiting)
        limit = settings.timeout
        if settings.learned:
            hangs, limit = self._learned(records, now)
        else:
            hangs = find_hangs(records, self.watcher.world_size, self.report_after, now)
        self.schedule, decision = decide(self.schedule, hangs, self.report_after, limit)
        if decision.report:
            self.report(hangs, decision, limit)

    def _learned(self, records: dict[int, dict[str, Any] | None], now: float
                 ) -> tuple[list[Hang], float | None]:
        """The learned timeout (:mod:`unirank.hang.learned`): the hangs past the report delay
        or the timeout now, a hang whose ranks are stuck first; the timeout where such a hang
        is past it (the job ends), else None (slow ranks: the reports go on as usual)."""
        self.learned = observe(self.learned, records)
        limit = timeout_now(self.learned)
        hangs = find_hangs(records, self.watcher.world_size, min(self.report_after, limit),
                           now)
        interval = self.watcher.settings.interval
        for hang in hangs:
            stuck = verdict_now(self.learned, hang, records, now, interval)
            if stuck and hang.waited >= limit:
                self.stuck = stuck
                return [hang, *(h for h in hangs if h is not hang)], limit
        return [h for h in hangs if h.waited >= self.report_after], None

    def ask(self, frozen: list[int] | None = None
            ) -> tuple[dict[int, list[dict[str, Any]]], list[int], dict[int, str]]:
        """Every rank's stacks (rank 0's own at once), those that did not answer in time, and
        the nodes the answers came from; ``frozen``: ranks not waited for (stopped)."""
        return request_stacks(self.store, self.watcher.world_size, self.answer_timeout,
                              own=self.watcher, skip=frozen or ())

    def report(self, hangs: list[Hang], decision: Decision, limit: float | None) -> None:
        frozen = [s.rank for s in self.stuck if s.why == SILENT] if decision.ending else []
        stacks, missing, nodes = self.ask(frozen)
        for hang in hangs:
            nodes.update({r: n for r, n in hang.nodes.items() if n})
        files = self._dump_files(decision.number)
        settings = self.watcher.settings
        names = settings.names
        if settings.learned:  # the reports say the learned timeout and why the ranks are stuck
            if names[1].startswith("-"):  # an option's default (or given): --hang-timeout auto
                names = (names[0], f"{names[1]} {HANG_TIMEOUT_AUTO}")
            why = "; ".join(s.words() for s in self.stuck)
            last = (f"ending the job ({why}; the learned hang timeout, {limit or 0.0:g} s; "
                    f"exit code {HANG_TIMEOUT})")
        else:
            last = (f"ending the job ({shown_setting(names[1], limit or 0.0)}, exit code "
                    f"{HANG_TIMEOUT})")
        last = last if decision.ending else ""
        if decision.full:
            self.first_stacks = stacks
        # a learned timeout's ending may come before the report delay: its head says why
        cause = "a stuck rank" if settings.learned and decision.ending else ""
        full = render_report(hangs, stacks, unanswered=missing, number=decision.number,
                             report_after=self.report_after, nodes=nodes,
                             answer_timeout=self.answer_timeout, dump_files=files,
                             ending=last, after_name=names[0], cause=cause)
        text = full if decision.full else render_report(
            hangs, stacks, unanswered=missing, number=decision.number,
            report_after=self.report_after, nodes=nodes, answer_timeout=self.answer_timeout,
            dump_files=files, ending=last, since=(1, changed_ranks(self.first_stacks, stacks)),
            after_name=names[0], cause=cause)
        self._write_dump(files, full, stacks, hangs)
        text, self.standby_note = self.standby_note + text, ""
        with contextlib.suppress(OSError):
            os.write(self.watcher.err_fd, text.encode(errors="replace"))
        if decision.ending:
            found = verdict(hangs[0])
            self.watcher.write_verdict(found)  # here before any rank ends
            self.watcher.exit_for_timeout(self.store, Ending(
                timeout_message(hangs, limit or 0.0, names[1]), blame(hangs[0]).ranks,
                self.watcher.rank, found, frozen=tuple(frozen)))

    def _stragglers(self, records: Mapping[int, Mapping[str, Any] | None], hung: bool) -> None:
        """The stragglers rule (:mod:`unirank.hang.slowrank`) at this look: one line on the
        console per rank named or recovered, after the ranks named now are in the store
        (:data:`~unirank.storekeys.hang.STRAGGLERS_KEY`, for :func:`unirank.elastic_state`)."""
        self.slow, changes = observe_slow(self.slow, records, hung)
        if changes:
            with contextlib.suppress(Exception):  # a store gone: the job ends, nobody asks
                self.store.set(STRAGGLERS_KEY, encode_named(self.slow))
            # said once the store holds it: who reads the line finds it in elastic_state
            text = "".join(change_line(c) for c in changes)
            with contextlib.suppress(OSError):
                os.write(self.watcher.err_fd, text.encode(errors="replace"))
        if self.slow.named and self.watcher.settings.on_slow != "warn" and not self.evicting:
            self._evict_slow(records)

    def _evict_slow(self, records: Mapping[int, Mapping[str, Any] | None]) -> None:
        """``--on-slow evict``: where evicting a straggler's node pays
        (:func:`unirank.hang.slowcost.to_evict`), the job ends as at a hang timeout, with a
        verdict that names that node's ranks, which every node's supervisor leaves out."""
        on_slow, spares = self.watcher.settings.on_slow, self._spares()
        pick = to_evict(list(self.slow.named.values()), records, self.watcher.world_size,
                        spares=spares, only_replaced=on_slow == "replace")
        if pick is None:
            return
        straggler, ranks = pick
        self.evicting = True  # once: the ending ends this process
        where = f" ({straggler.node})" if straggler.node else ""
        fate = "evicted, a spare node takes its place" if spares else "evicted"
        message = (f"rank {straggler.rank}{where} kept the others waiting "
                   f"{straggler.margin * 100:.0f} % of the time: its node is {fate} "
                   f"(--on-slow {on_slow}, exit code {HANG_TIMEOUT})")
        found = slow_verdict(straggler, ranks)
        self.watcher.write_verdict(found)  # here before any rank ends
        self.watcher.exit_for_timeout(self.store, Ending(message, tuple(ranks),
                                                         self.watcher.rank, found))

    def _spares(self) -> int:
        """How many spare nodes wait to join now (the run's spares file, which this node's
        ``unirank run`` keeps: :attr:`unirank.runfolder.RunFolder.spares_file`); 0 where
        unknown."""
        folder = self.watcher.attempt_folder()
        return (read_spares(AttemptFolder(folder).run.spares_file) or 0) if folder else 0

    def _mark_waiting(self, waiting: bool) -> None:
        """Keep the attempt folder's waiting mark
        (:attr:`unirank.runfolder.AttemptFolder.waiting_mark`) while some rank has
        waited one interval (the supervisor's sign to ask for the report at a stop); at every
        look, so that a standby's mark does not outlive its duty."""
        folder = self.watcher.attempt_folder()
        if not folder:
            return
        path = AttemptFolder(folder).waiting_mark
        with contextlib.suppress(OSError):
            if not waiting:
                os.unlink(path)
            elif not os.path.exists(path):
                with open(path, "w", encoding="utf-8"):
                    pass

    def _dump_files(self, number: int) -> list[str]:
        folder = self.watcher.attempt_folder()
        if not folder:
            return []
        return AttemptFolder(folder).hang_reports(number)

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


def _hang_json(hang: Hang) -> dict[str, Any]:
    from dataclasses import asdict

    data = asdict(hang)
    data["nodes"] = {str(k): v for k, v in hang.nodes.items()}
    return data
