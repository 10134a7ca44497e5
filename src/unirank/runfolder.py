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
            ranks-waiting                       the hang detector's mark (hang.WAITING_MARK)
            hang/report-<n>.txt, .json          rank 0's hang reports (hang.HANG_FOLDER)

A run never reuses a folder: like torchrun's, it is made with a random suffix after the run
id (``tempfile.mkdtemp``), so that a run started again with the same ``--log-dir`` and run id
(a requeued Slurm job keeps its id; the c10d rendezvous's default id is ``none``) keeps every
earlier run's ``attempt_<n>`` folders. Workers are told their attempt's folder
(UNIRANK_ATTEMPT_DIR, set by :mod:`unirank.supervisor.workerenv`) and never derive it; a
worker that torchrun started is not told, and :func:`attempt_folder_of` reads torchrun's
layout from its error file's path instead, only where the path has that shape.

Reads (:func:`attempt_folder_of`, from the mapping it is given): UNIRANK_ATTEMPT_DIR,
TORCHELASTIC_ERROR_FILE.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass

from unirank.contract import ATTEMPT_DIR_VAR, ERROR_FILE_VAR
from unirank.hang import HANG_FOLDER, WAITING_MARK

__all__ = ["FILTERED_FILES", "AttemptFolder", "RunFolder", "attempt_folder_of", "make_run_folder"]

#: the duplicate filters' copies of stdout (1) and stderr (2), in the attempt's folder
FILTERED_FILES = {1: "filtered_stdout.log", 2: "filtered_stderr.log"}
#: the attempt's file of the worker lines kept off the console
FOLDED_FILE = "folded.log"
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
        return os.path.join(self.path, WAITING_MARK)

    @property
    def hang_folder(self) -> str:
        return os.path.join(self.path, HANG_FOLDER)


@dataclass(frozen=True)
class RunFolder:
    """The folder of one run: its attempts' folders."""

    path: str

    def attempt(self, number: int) -> AttemptFolder:
        return AttemptFolder(os.path.join(self.path, f"attempt_{number}"))

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
        return [AttemptFolder(os.path.join(self.path, n)) for n in names]


def make_run_folder(log_dir: str, run_id: str) -> RunFolder:
    """A new run's folder in ``log_dir`` (made, with its parents): ``<run_id>_<random>``, never
    one that exists already. OSError when it cannot be made."""
    os.makedirs(log_dir, exist_ok=True)
    safe = run_id.replace(os.sep, "_") or "run"
    return RunFolder(tempfile.mkdtemp(prefix=f"{safe}_", dir=log_dir))


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
