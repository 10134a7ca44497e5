"""``ur.stop_requested``, ``ur.time_left`` and ``ur.exit_for_requeue`` in this process (world
size 1, no collective); the two-rank agreement and the Slurm requeue run in
tests/integration/test_preemption.py. ``squeue`` and ``scontrol`` are small stand-in scripts
on the PATH of the environment each call is given (the real ones are exercised on the testbed).
Every call takes its environment as a dict; none of these tests changes ``os.environ``."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Optional

import pytest

import unirank as ur
from unirank import slurmcmd
from unirank.distenv import DistEnv
from unirank.exitcodes import REQUEUE as REQUEUE_EXIT_CODE
from unirank.runtime import preemption


@pytest.fixture(autouse=True)
def fresh(serial: DistEnv) -> Iterator[None]:
    preemption.unwatch_stop_signals()
    yield
    preemption.unwatch_stop_signals()


def test_a_signal_sets_a_flag_that_the_next_call_returns_and_handlers_come_back() -> None:
    seen: list[int] = []

    def previous(signum: int, frame: Optional[FrameType]) -> None:
        seen.append(signum)

    old = signal.signal(signal.SIGUSR2, previous)
    try:
        assert set(ur.watch_stop_signals(environ={})) == {signal.SIGUSR2, signal.SIGTERM}
        assert ur.stop_requested(environ={}) is False
        os.kill(os.getpid(), signal.SIGUSR2)
        assert seen == []  # the flag-only handler took it
        assert ur.stop_requested(environ={}) is True
        assert ur.stop_requested(environ={}) is True  # stays True
        ur.unwatch_stop_signals()
        assert signal.getsignal(signal.SIGUSR2) is previous
        assert ur.stop_requested(environ={}) is False  # forgotten; watching again
    finally:
        ur.unwatch_stop_signals()
        signal.signal(signal.SIGUSR2, old)


def test_under_slurm_sigterm_is_watched_too_unless_configured() -> None:
    """Slurm ends a run (scancel, requeue, preemption) with SIGTERM: a stop, to save first."""
    assert ur.watch_stop_signals(environ={"SLURM_JOB_ID": "5"}) == (signal.SIGUSR2,
                                                                    signal.SIGTERM)
    ur.unwatch_stop_signals()
    assert ur.watch_stop_signals(environ={"SLURM_JOB_ID": "5", "UNIRANK_STOP_SIGNALS": "USR1"}
                                 ) == (signal.SIGUSR1,)


def test_every_must_be_positive() -> None:
    with pytest.raises(ValueError, match="every must be 1 or more, not 0"):
        ur.stop_requested(every=0)


def _stand_in(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_time_left_from_the_end_time_or_squeue(tmp_path: Path) -> None:
    assert ur.time_left(environ={}) is None  # outside Slurm
    ur.unwatch_stop_signals()
    ends = str(int(time.time()) + 100)
    left = ur.time_left(environ={"SLURM_JOB_ID": "5", "SLURM_JOB_END_TIME": ends})
    assert left is not None and 90 < left <= 100
    ur.unwatch_stop_signals()
    _stand_in(tmp_path, "squeue", f'echo "$@" > {tmp_path}/asked; echo "1-00:00:10"')
    environ = {"SLURM_JOB_ID": "5", "PATH": str(tmp_path)}
    left = ur.time_left(environ=environ)
    assert left is not None and 86300 < left <= 86410
    assert ur.stop_requested(time_margin=60, environ=environ) is False
    assert ur.stop_requested(time_margin=90000, environ=environ) is True
    assert (tmp_path / "asked").read_text() == "-h -j 5 -o %L\n"


def test_time_left_knows_the_job_by_its_older_variable_too(tmp_path: Path) -> None:
    """SLURM_JOBID alone (the older spelling) is a Slurm job as SLURM_JOB_ID is."""
    _stand_in(tmp_path, "squeue", f'echo "$@" > {tmp_path}/asked; echo "10:00"')
    left = ur.time_left(environ={"SLURM_JOBID": "6", "PATH": str(tmp_path)})
    assert left is not None and 500 < left <= 600
    assert (tmp_path / "asked").read_text() == "-h -j 6 -o %L\n"


def test_exit_for_requeue_outside_any_launcher_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        ur.exit_for_requeue(environ={})
    assert caught.value.code == 0
    assert "stopped after the checkpoint; run the same command again to resume" in (
        capsys.readouterr().err)


def _exit_for_requeue_in_job(tmp_path: Path, **slurm: str) -> object:
    """``ur.exit_for_requeue()`` in Slurm job 43 (``slurm`` variables replace or add to
    SLURM_JOB_ID=43), with only ``tmp_path``'s stand-ins on PATH: the code it exits with."""
    with pytest.raises(SystemExit) as caught:
        ur.exit_for_requeue(environ={"PATH": str(tmp_path), "SLURM_JOB_ID": "43", **slurm})
    return caught.value.code


def _scontrol(folder: Path, shown: str) -> None:
    """A stand-in scontrol: ``show job`` prints ``shown``; every call is recorded in asked."""
    _stand_in(folder, "scontrol", f'echo "$@" >> {folder}/asked\n'
              f'[ "$1" = show ] && echo "{shown}"; exit 0')


def test_exit_for_requeue_under_slurm_requeues_and_exits_79(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    _scontrol(tmp_path, "JobId=41 ArrayJobId=40 ArrayTaskId=3 JobState=RUNNING Restarts=0")
    code = _exit_for_requeue_in_job(tmp_path, SLURM_ARRAY_JOB_ID="40",
                                    SLURM_ARRAY_TASK_ID="3")
    assert code == REQUEUE_EXIT_CODE
    assert (tmp_path / "asked").read_text() == "show job -o 40_3\nrequeue 40_3\n"
    assert "requeueing job 40_3" in capsys.readouterr().err


def test_a_job_that_slurm_requeues_already_is_left_to_slurm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """``scontrol requeue`` by an admin, or preemption: SIGTERM, and Restarts is already one
    past this run's SLURM_RESTART_COUNT: no second requeue, exit 79 (not a failure)."""
    _scontrol(tmp_path, "JobId=43 JobState=COMPLETING Restarts=2")
    assert _exit_for_requeue_in_job(tmp_path, SLURM_RESTART_COUNT="1") == REQUEUE_EXIT_CODE
    assert (tmp_path / "asked").read_text() == "show job -o 43\n"
    assert ("unirank: stopped to be requeued (exit code 79); Slurm requeues job 43"
            in capsys.readouterr().err)


def test_a_cancelled_job_is_not_requeued_and_ends_as_sigterm_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """scancel (or the time limit): SIGTERM, the job COMPLETING with the same Restarts: the
    checkpoint is saved, nothing is requeued, every rank exits 143."""
    _scontrol(tmp_path, "JobId=43 JobState=COMPLETING Restarts=0")
    assert _exit_for_requeue_in_job(tmp_path) == 128 + signal.SIGTERM
    assert (tmp_path / "asked").read_text() == "show job -o 43\n"
    assert ("unirank: stopped after the checkpoint; Slurm is ending job 43 without a requeue"
            in capsys.readouterr().err)


def test_without_scontrol_the_batch_shell_is_left_to_requeue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    assert _exit_for_requeue_in_job(tmp_path) == REQUEUE_EXIT_CODE
    assert ("unirank: scontrol not found: exiting with 79 so that the batch script requeues "
            "job 43") in capsys.readouterr().err


def test_past_the_cap_every_rank_fails_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    _stand_in(tmp_path, "scontrol", f"touch {tmp_path}/asked")
    assert _exit_for_requeue_in_job(tmp_path, SLURM_RESTART_COUNT="10") == 1
    assert "unirank: not requeueing job 43 again: it ran 11 times" in capsys.readouterr().err
    assert not (tmp_path / "asked").exists()


def test_a_job_known_by_its_older_variable_is_requeued_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """SLURM_JOBID alone names the job as SLURM_JOB_ID does: requeued, not left as a local
    run (which would exit 79 without asking Slurm)."""
    _scontrol(tmp_path, "JobId=44 JobState=RUNNING Restarts=0")
    with pytest.raises(SystemExit) as caught:
        ur.exit_for_requeue(environ={"PATH": str(tmp_path), "SLURM_JOBID": "44"})
    assert caught.value.code == REQUEUE_EXIT_CODE
    assert (tmp_path / "asked").read_text() == "show job -o 44\nrequeue 44\n"
    assert "requeueing job 44" in capsys.readouterr().err


def test_a_scontrol_that_does_not_answer_is_given_up_after_the_one_slurm_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``scontrol requeue`` runs through the one Slurm command runner, with its timeout (made
    short here): a controller that does not answer is reported, and the batch shell requeues."""
    monkeypatch.setattr(slurmcmd, "COMMAND_TIMEOUT_S", 0.2)
    fifo = tmp_path / "never"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDWR)  # a writer that never writes: cat waits on it for ever
    try:
        _stand_in(tmp_path, "scontrol", f'[ "$1" = show ] && exit 0; exec /bin/cat {fifo}')
        assert _exit_for_requeue_in_job(tmp_path) == REQUEUE_EXIT_CODE
    finally:
        os.close(held)
    assert ("unirank: scontrol requeue 43 failed: scontrol did not answer in 0.2 s; exiting with "
            "79 for the batch script") in capsys.readouterr().err
