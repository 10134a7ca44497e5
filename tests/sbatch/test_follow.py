"""The pieces behind ``unirank sbatch --follow`` and ``--explicit-env``, without Slurm: parsing
what scontrol/sacct say, the exit code rule, streaming a growing (or truncated) log, srun's
failure lines, the cancel-or-detach question, the SIGINT flag, and the written-out rendezvous
(recorded environments of one real batch job: its batch shell and its first step).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from unirank.exitcodes import INTERRUPTED
from unirank.launchers import detect
from unirank.sbatch.commands import JobInfo, exit_status, parse_sacct, parse_scontrol
from unirank.sbatch.follow import FileStream, Interrupt, _ask, failed_tasks
from unirank.sbatch.jobenv import batch_master
from unirank.sbatch.jobenv import main as jobenv_main

ENVS = Path(__file__).resolve().parents[1] / "fixtures" / "envs"

SCONTROL = (
    "JobId=15 JobName=train UserId=root(0) GroupId=root(0) Priority=1 JobState=FAILED "
    "Reason=NonZeroExitCode Dependency=(null) Requeue=1 Restarts=2 BatchFlag=1 ExitCode=1:0 "
    "NodeList=node[1-2] StdErr=/work/logs/train-15.err StdIn=/dev/null "
    "StdOut=/work/logs/train-15.out Power="
)


def test_scontrol_record() -> None:
    assert parse_scontrol(SCONTROL + "\n") == JobInfo(
        state="FAILED", exit_code=1, signal=0, restarts=2, reason="NonZeroExitCode",
        nodes="node[1-2]", stdout="/work/logs/train-15.out", stderr="/work/logs/train-15.err",
        requeue=True)
    assert parse_scontrol("") is None


def test_sacct_record() -> None:
    assert parse_sacct("CANCELLED by 0|0:15|node1\n") == JobInfo(
        state="CANCELLED", exit_code=0, signal=15, nodes="node1")
    assert parse_sacct("") is None


@pytest.mark.parametrize("info,code", [
    (JobInfo("COMPLETED"), 0), (JobInfo("FAILED", exit_code=3), 3),
    (JobInfo("CANCELLED", signal=9), 137), (JobInfo("TIMEOUT"), 1),
    (JobInfo("FAILED", exit_code=79), 79),
])
def test_exit_status(info: JobInfo, code: int) -> None:
    assert exit_status(info) == code
    assert info.done


def test_running_requeued_and_pending_jobs_are_not_done() -> None:
    for state in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", "SUSPENDED"):
        assert not JobInfo(state).done


def test_file_stream_copies_what_was_appended_and_rereads_a_truncated_file(
    tmp_path: Path,
) -> None:
    log = tmp_path / "job.out"
    sink = io.BytesIO()
    stream = FileStream(str(log), sink)
    assert stream.pump() == 0  # not there yet (job pending)
    log.write_bytes(b"run 0 line 1\n")
    assert stream.pump() == 13
    with log.open("ab") as handle:
        handle.write(b"run 1 line 1\n")  # a requeued run appending
    stream.pump()
    assert stream.pump() == 0
    log.write_bytes(b"new\n")  # a run that truncated the log
    stream.pump()
    assert sink.getvalue() == b"run 0 line 1\nrun 1 line 1\nnew\n"
    assert stream.tail == ["run 0 line 1", "run 1 line 1", "new"]


def test_failed_tasks_from_srun_lines() -> None:
    lines = ["hello", "srun: error: node2: task 3: Exited with exit code 1",
             "srun: error: node1: tasks 0-1: Killed", "0: srun: error: x"]
    assert failed_tasks(lines) == ["3 (node2): Exited with exit code 1", "0-1 (node1): Killed"]


def test_ctrl_c_asks_on_a_terminal_and_detaches_otherwise() -> None:
    def never(prompt: str) -> str:
        raise AssertionError("asked without a terminal")

    def eof(prompt: str) -> str:
        raise EOFError

    assert _ask("7", False, never) == "detach"
    assert _ask("7", True, lambda prompt: "c") == "cancel"
    assert _ask("7", True, lambda prompt: "cancel\n") == "cancel"
    assert _ask("7", True, lambda prompt: "") == "detach"
    assert _ask("7", True, eof) == "detach"


def test_sigint_only_sets_the_flag_and_wakes_the_wait() -> None:
    before = signal.getsignal(signal.SIGINT)
    with Interrupt() as interrupt:
        os.kill(os.getpid(), signal.SIGINT)
        assert interrupt.wait(60.0) is True  # woken by the signal, not by the 60 s
        assert interrupt.pending
    assert signal.getsignal(signal.SIGINT) is before


def _env(name: str) -> dict[str, str]:
    data: dict[str, str] = json.loads((ENVS / name).read_text())
    return data


def test_explicit_env_is_what_the_first_step_derives() -> None:
    """job 43 of the testbed: its batch shell's written-out values equal what ranks 0 and 3 of
    its first srun step detected without them."""
    master = batch_master(_env("sbatch_batch_shell.json"))
    for rank in (0, 3):
        step = detect(_env(f"sbatch_N2_n4_step_rank{rank}.json"), [], hostname="x")
        assert (master.addr, master.port) == (step.master_addr, step.master_port)
    assert (master.addr, master.port) == ("node1", 20000 + 12 * 43)


def test_explicit_env_keeps_a_master_the_user_set(capsys: pytest.CaptureFixture[str]) -> None:
    environ = {**_env("sbatch_batch_shell.json"), "MASTER_PORT": "29999"}
    assert jobenv_main(["MASTER_PORT"], environ) == 0
    assert jobenv_main(["MASTER_ADDR"], environ) == 0
    assert capsys.readouterr().out == "29999\nnode1\n"
    assert jobenv_main(["MASTER_ADDR"], {}) == 2
    assert jobenv_main(["OTHER"], environ) == 2


def test_an_elastic_job_s_secret_is_fresh_each_time(capsys: pytest.CaptureFixture[str]) -> None:
    assert jobenv_main(["RDZV_SECRET"], {}) == 0 and jobenv_main(["RDZV_SECRET"], {}) == 0
    first, second = capsys.readouterr().out.split()
    assert len(first) == 64 and int(first, 16) >= 0 and first != second


def test_a_preempted_job_that_may_be_requeued_is_not_done() -> None:
    preempted = parse_scontrol(SCONTROL.replace("FAILED", "PREEMPTED"))
    assert preempted is not None and preempted.requeue and not preempted.done
    final = parse_scontrol(SCONTROL.replace("FAILED", "PREEMPTED").replace("Requeue=1",
                                                                          "Requeue=0"))
    assert final is not None and final.done


def _fake_slurm(bin_dir: Path, log: Path) -> None:
    """``sbatch`` that answers job 7, and ``scontrol`` that shows it RUNNING with ``log`` as its
    output, then presses Ctrl-C on its caller (SIGINT to the parent, as a terminal would)."""
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\ncat >/dev/null\necho 7\n")
    record = SCONTROL.replace("JobId=15", "JobId=7").replace("JobState=FAILED", "JobState=RUNNING")
    record = record.replace("/work/logs/train-15.out", str(log)).replace("/work/logs/train-15.err",
                                                                         str(log))
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho '{record}'\nkill -INT $PPID\n")
    for name in ("sbatch", "scontrol"):
        (bin_dir / name).chmod(0o755)


def test_a_detach_by_ctrl_c_exits_130_and_says_how_to_follow_again(tmp_path: Path) -> None:
    """The real ``unirank sbatch --submit --follow`` against fake sbatch and scontrol (no Slurm
    here): Ctrl-C without a terminal detaches; the exit is 130, not 0, so ``... --follow &&
    next`` stops there, and the last line says the job goes on and how to follow it again."""
    log = tmp_path / "train-7.out"
    log.write_text("step 1\n")
    (tmp_path / "train.py").write_text("")
    _fake_slurm(tmp_path / "bin", log)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "-m", "unirank", "sbatch", "-N", "1", "--submit",
                           "--follow", "train.py"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert done.returncode == INTERRUPTED, (done.returncode, done.stderr)
    assert done.stdout.startswith("Submitted batch job 7\n"), done.stdout
    assert "step 1" in done.stdout + done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"unirank sbatch: detached; job 7 keeps running: tail -f {log} follows its output, "
        "scancel 7 stops it"), done.stderr
