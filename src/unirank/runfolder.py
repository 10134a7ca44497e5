"""Every path of a run's folder and of an attempt's, built in one place (torchrun's layout):

    <log_dir>/<run_id>_<random>/                 the run (:class:`RunFolder`; a fresh one each run)
        attempt_<n>/                            one attempt (:class:`AttemptFolder`)
            <local_rank>/error.json             TORCHELASTIC_ERROR_FILE
            <local_rank>/fault.txt              a fatal signal's Python stack
            <local_rank>/stdout.log, stderr.log --redirects / --tee
            filtered_stdout.log, filtered_stderr.log   the duplicate filters' copies
            folded.log                          worker lines kept off the console: torch's C++
                                                stacks, the lines of workers a change of the
                                                world stopped (kept, with its run folder)
            timeline.json                       rank 0's end-of-run records
            ranks-waiting                       the hang detector's mark
            in-collective.<rank>                the rank waits in one collective (a second
                                                and more): its supervisor's sign to end it
                                                when a node is gone (:mod:`unirank.hang.waits`)
            hang-verdict.json                   the verdict of a hang that ended the job
            on-hang                             the program's on_hang= keyword
            hang/report-<n>.txt, .json          rank 0's hang reports

Without ``--log-dir`` the run's folder is a temporary one, ``<tmp>/unirank-run-XXXX`` with its
owner's ``owner.json`` (:func:`make_temporary_run_folder`), removed when the run ends unless
it holds hang reports (:func:`end_run_folder`); what a run killed by SIGKILL left is
swept by a later run (the rule: :mod:`unirank.sweep`).

A run never reuses a folder: like torchrun's, it is made with a random suffix after the run
id (``tempfile.mkdtemp``), so that a run started again with the same ``--log-dir`` and run id
(a requeued Slurm job keeps its id; the c10d rendezvous's default id is ``none``) keeps every
earlier run's ``attempt_<n>`` folders. Workers are told their attempt's folder
(UNIRANK_ATTEMPT_DIR, set by :mod:`unirank.supervisor.workerenv`) and never derive it; a
worker that torchrun started is not told, and :func:`attempt_folder_of` reads torchrun's
layout from its error file's path instead, only where the path has that shape.

Reads (:func:`attempt_folder_of`, from the mapping it is given): UNIRANK_ATTEMPT_DIR,
TORCHELASTIC_ERROR_FILE; TMPDIR (:func:`make_temporary_run_folder`, :func:`end_run_folder`:
through :func:`tempfile.gettempdir`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from unirank.contract import ATTEMPT_DIR_VAR, ERROR_FILE_VAR
from unirank.sweep import BOOKKEEPING, EVICTED_FILE, SLOW_LINK_FILE, SPARES_FILE

__all__ = ["FILTERED_FILES", "AttemptFolder", "RunFolder", "attempt_folder_of",
           "end_run_folder", "make_run_folder", "make_temporary_run_folder", "read_evicted",
           "read_slow_link", "read_spare_nodes", "read_spares", "write_evicted",
           "write_slow_link", "write_spares"]

#: the duplicate filters' copies of stdout (1) and stderr (2), in the attempt's folder
FILTERED_FILES = {1: "filtered_stdout.log", 2: "filtered_stderr.log"}
#: the folder (next to the ranks' ``<local rank>/error.json``) where rank 0's hang detector
#: writes every report with every rank's stacks, as text and JSON (kept after the run)
_HANG_FOLDER = "hang"
#: the file the hang detector keeps while some rank has waited in a collective for one
#: interval or more that another has not entered: the supervisor asks for the report at a stop
#: signal only then, so that a plain Ctrl-C is forwarded at once
_WAITING_MARK = "ranks-waiting"
_COLLECTIVE_MARK = "in-collective"
#: where the detector's rank (rank 0) writes the verdict of a hang that ends the job
#: (``--hang-timeout``), and every rank again as it ends (the verdict travels in the
#: :class:`~unirank.hang.ending.Ending`, so every node has it): ``{"never_entered": [ranks],
#: "call": "all_reduce #12"}``, what the supervisor's ``--on-hang evict`` reads
#: (:func:`unirank.hang.detect.verdict`); or ``--on-slow evict``'s, ``{"slow": [ranks],
#: "straggler": rank, "share": 0.8}`` (:func:`unirank.hang.slowcost.slow_verdict`)
_HANG_VERDICT = "hang-verdict.json"
#: where the program's ranks write the ``on_hang=`` keyword of :func:`unirank.init` /
#: ``Parallel`` (one word, ``exit``, ``restart`` or ``evict``): what the supervisor does at
#: that attempt's hang timeout (:func:`unirank.contract.on_hang_now`)
_ON_HANG_ASKED = "on-hang"
#: the attempt's file of the worker lines kept off the console
FOLDED_FILE = "folded.log"
#: the run's file of how many spare nodes wait to join the elastic job (a number; the
#: rendezvous tells each node's ``unirank run``, which keeps it here for rank 0's detector:
#: ``--on-slow replace``): :data:`unirank.sweep.SPARES_FILE`, which the sweep never takes for
#: a report
#: torchrun's error file: ``attempt_<n>/<local rank>/error.json``
_TORCHRUN_ERROR_FILE = re.compile(r"(?P<attempt>.*/attempt_\d+)/\d+/error\.json")


@dataclass(frozen=True)
class AttemptFolder:
    """The folder of one attempt and every path in it."""

    path: str

    def worker(self, local_rank: int) -> str:
        """The folder of one local rank (made before the worker starts, so that torch's
        ``@record`` can write its error file there)."""
        return os.path.join(self.path, str(local_rank))

    def error_file(self, local_rank: int) -> str:
        return os.path.join(self.worker(local_rank), "error.json")

    def fault_file(self, local_rank: int) -> str:
        return os.path.join(self.worker(local_rank), "fault.txt")

    def log_file(self, local_rank: int, bit: int) -> str:
        """``stdout.log`` (bit 1) or ``stderr.log`` (bit 2) of one local rank."""
        return os.path.join(self.worker(local_rank), "stdout.log" if bit == 1 else "stderr.log")

    def filtered_file(self, bit: int) -> str:
        return os.path.join(self.path, FILTERED_FILES[bit])

    @property
    def folded_file(self) -> str:
        """The worker lines kept off the console (see :mod:`unirank.supervisor.streams`)."""
        return os.path.join(self.path, FOLDED_FILE)

    @property
    def timeline_file(self) -> str:
        return os.path.join(self.path, "timeline.json")

    @property
    def waiting_mark(self) -> str:
        return os.path.join(self.path, _WAITING_MARK)

    def collective_mark(self, rank: int) -> str:
        """Kept while rank ``rank`` waits in one collective (:class:`unirank.hang.waits.
        CollectiveMark`)."""
        return os.path.join(self.path, f"{_COLLECTIVE_MARK}.{rank}")

    @property
    def hang_folder(self) -> str:
        return os.path.join(self.path, _HANG_FOLDER)

    def hang_reports(self, number: int) -> list[str]:
        """Rank 0's hang report ``number``: its text and its JSON."""
        stem = os.path.join(self.hang_folder, f"report-{number}")
        return [f"{stem}.txt", f"{stem}.json"]

    @property
    def hang_verdict(self) -> str:
        return os.path.join(self.path, _HANG_VERDICT)

    @property
    def on_hang_asked(self) -> str:
        return os.path.join(self.path, _ON_HANG_ASKED)

    @property
    def run(self) -> RunFolder:
        """The folder of the run this attempt is one of (its bookkeeping files: the spares,
        the last eviction, the slow link)."""
        return RunFolder(os.path.dirname(self.path))


@dataclass(frozen=True)
class RunFolder:
    """The folder of one run: its attempts' folders."""

    path: str

    def attempt(self, number: int) -> AttemptFolder:
        return AttemptFolder(os.path.join(self.path, f"attempt_{number}"))

    @property
    def spares_file(self) -> str:
        return os.path.join(self.path, SPARES_FILE)

    @property
    def evicted_file(self) -> str:
        """Where this node's ``unirank run`` records the last eviction of the run's nodes
        (:func:`write_evicted`), for ``unirank top``."""
        return os.path.join(self.path, EVICTED_FILE)

    @property
    def slow_link_file(self) -> str:
        """Where this node's ``unirank run`` keeps the node whose link the rendezvous names
        slow now (:func:`write_slow_link`), for ``ur.elastic_state()`` and ``unirank top``."""
        return os.path.join(self.path, SLOW_LINK_FILE)

    def has_hang_reports(self) -> bool:
        """Whether rank 0's hang detector wrote reports in some attempt of the run."""
        return any(os.path.isdir(a.hang_folder) for a in self._attempts())

    def has_folded_lines(self) -> bool:
        """Whether some attempt's worker lines were kept off the console, in its file."""
        return any(os.path.isfile(a.folded_file) for a in self._attempts())

    def _attempts(self) -> list[AttemptFolder]:
        try:
            names = os.listdir(self.path)
        except OSError:
            return []
        return [AttemptFolder(os.path.join(self.path, n)) for n in names
                if n not in BOOKKEEPING]


def make_run_folder(log_dir: str, run_id: str) -> RunFolder:
    """A new run's folder in ``log_dir`` (made, with its parents): ``<run_id>_<random>``, never
    one that exists already. OSError when it cannot be made."""
    os.makedirs(log_dir, exist_ok=True)
    safe = run_id.replace(os.sep, "_") or "run"
    return RunFolder(tempfile.mkdtemp(prefix=f"{safe}_", dir=log_dir))


def make_temporary_run_folder(shm: str | None = None) -> RunFolder:
    """A new run's folder in the temporary folder, owned by this process, once what earlier
    runs left there (and in ``shm``, the snapshot memory's root) is swept
    (:func:`unirank.sweep.sweep`). OSError when it cannot be made."""
    from unirank.sweep import RUN_PREFIX, make_owned_folder, sweep

    sweep(shm=shm)
    return RunFolder(make_owned_folder(RUN_PREFIX))


def end_run_folder(root: RunFolder, temporary: bool, shm: str | None = None) -> bool:
    """At the run's end: remove its ``temporary`` folder unless it holds hang reports or
    worker lines kept off the console (``folded.log``, named by a line when written), then
    sweep what the run's killed workers left (their job files, and in ``shm``:
    :func:`unirank.sweep.sweep`);
    whether a temporary folder is kept for its hang reports (which the caller names)."""
    from unirank.sweep import sweep

    reports = temporary and root.has_hang_reports()
    if temporary and not reports and not root.has_folded_lines():
        shutil.rmtree(root.path, ignore_errors=True)
    sweep(shm=shm)
    return reports


def write_spares(path: str, names: Sequence[str]) -> None:
    """Keep the spare nodes waiting to join (their names, "" where not known) in a run's spares
    file (:attr:`RunFolder.spares_file`): their count on the first line, then a name a
    line."""
    _write_whole(path, "".join(f"{line}\n" for line in (str(len(names)), *names)))


def read_spares(path: str) -> int | None:
    """The count in a run's spares file (:func:`write_spares`); None where there is none to
    read."""
    try:
        with open(path, encoding="utf-8") as fh:
            return max(int(fh.readline().strip() or 0), 0)
    except (OSError, ValueError):
        return None


def read_spare_nodes(path: str) -> tuple[str, ...] | None:
    """The spare nodes' names in a run's spares file (:func:`write_spares`; "" where not
    known); None where there is none to read."""
    try:
        with open(path, encoding="utf-8") as fh:
            count, *names = fh.read().split("\n")[:-1]
        known = max(int(count), 0)
        return (*names[:known], *("",) * (known - len(names)))
    except (OSError, ValueError):
        return None


def _write_whole(path: str, text: str) -> None:
    """Write ``text`` to ``path`` whole (a reader never sees half of it: a part file of this
    process, then renamed); nothing where it cannot be written."""
    part = f"{path}.{os.getpid()}"
    try:
        with open(part, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(part, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(part)


def write_evicted(path: str, attempt: int, ranks: Sequence[int], why: str) -> None:
    """Record (replacing the last) that the nodes of ``ranks`` (every rank of theirs) left
    the run after ``attempt``, and ``why`` (``node evicted: rank 1 never entered all_reduce
    #12``)."""
    _write_whole(path, json.dumps({"attempt": attempt, "ranks": sorted(ranks), "why": why}))


def write_slow_link(path: str, node: str) -> None:
    """Keep the node whose link the rendezvous names slow now (its label: ``vm (10.0.0.3)``;
    "" once none is)."""
    _write_whole(path, f"{node}\n")


def read_slow_link(path: str) -> str:
    """The node :func:`write_slow_link` kept ("" where none, or nothing to read)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.readline().strip()
    except OSError:
        return ""


def read_evicted(path: str) -> tuple[int, tuple[int, ...], str] | None:
    """The last eviction :func:`write_evicted` recorded: its attempt, ranks and why; None
    where there is none to read."""
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
        return (int(record["attempt"]), tuple(int(r) for r in record["ranks"]),
                str(record["why"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def attempt_folder_of(environ: Mapping[str, str]) -> str:
    """The attempt's folder of this worker: UNIRANK_ATTEMPT_DIR (``unirank run`` tells its
    workers), else the one torchrun's error file lies in (``.../attempt_<n>/<local
    rank>/error.json``), else "" (plain python: no folder, whatever TORCHELASTIC_ERROR_FILE
    says).

    Reads: UNIRANK_ATTEMPT_DIR, TORCHELASTIC_ERROR_FILE.
    """
    told = environ.get(ATTEMPT_DIR_VAR, "")
    if told:
        return told
    match = _TORCHRUN_ERROR_FILE.fullmatch(environ.get(ERROR_FILE_VAR, ""))
    return match["attempt"] if match else ""
