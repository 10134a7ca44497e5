"""``run_slurm``, the one runner of Slurm commands: it answers for a command it cannot start
and for one that does not answer in time, instead of raising or hanging."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from unirank import slurmcmd
from unirank.sbatch.commands import run_slurm


def test_a_command_that_cannot_start_answers_127(tmp_path: Path) -> None:
    done = run_slurm([str(tmp_path / "scontrol"), "show", "job"])
    assert done.returncode == 127
    assert done.stderr.startswith("scontrol could not run:")


def test_a_command_that_does_not_answer_is_stopped_at_the_one_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(slurmcmd, "COMMAND_TIMEOUT_S", 0.2)
    fifo = tmp_path / "never"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDWR)  # a writer that never writes: cat waits on it for ever
    try:
        done = run_slurm(["/bin/cat", str(fifo)])
    finally:
        os.close(held)
    assert (done.returncode, done.stderr) == (124, "cat did not answer in 0.2 s")

