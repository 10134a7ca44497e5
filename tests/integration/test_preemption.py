"""Stop -> checkpoint -> requeue -> resume with real processes: the stop agreement under
``unirank run -n 2`` (gloo), ``examples/train.py`` stopped by SIGUSR2 under ``unirank run`` and
resumed, and THE preemption test on the two-node Slurm testbed: ``unirank sbatch --requeue``,
``scancel --signal=USR2`` (what Slurm's ``--signal`` does: the steps' tasks get it), the job
checkpoints, requeues itself, resumes and ends with the parameters of an unbroken run.

Every wait reads lines (never a sleep); every process and job has a timeout.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from unirank.exitcodes import REQUEUE as REQUEUE_EXIT_CODE

if TYPE_CHECKING:
    from conftest import SlurmTestbed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _outputs import EXAMPLES, JOB_ENV, PY, REPO
from test_sbatch_cmd import _described, start

from _procs import Runner, launcher_free_environ, read_stdout_until

pytestmark = pytest.mark.integration

TRAIN = str(EXAMPLES / "train.py")
STOP_JOB = str(REPO / "tests" / "runtime" / "scripts" / "stop_job.py")
STATE_REQUEUE = str(Path(__file__).resolve().parent / "scripts" / "state_requeue.py")
#: 8 steps per epoch over 2 ranks; enough epochs that a stop lands mid-run
ARGS = ["--seed", "3", "--nb_samples", "128", "--batch_size", "16", "--log_interval", "1",
        "--epochs", "25"]
DIGEST = re.compile(r"Process (\d)/2 parameters ([0-9a-f]{16})")
# workers may share one stdout: a line can be glued to the next, so match anywhere
STEP = re.compile(r"Process (\d)/2 Train Epoch: (\d+) \[(\d+)/128\]")
TIMEOUT = 240.0
#: a sitecustomize that holds a first run at one step until a stop is requested (see there)
HOLD = Path(__file__).resolve().parent / "hold"
#: the step the first run holds at (2 ranks, 8 steps an epoch: mid-epoch 0)
HOLD_AT = 3


#: what every run here adds to the launcher-free environment
RUN_ENV = {**JOB_ENV, "PYTHONPATH": str(REPO / "src")}


def _env() -> dict[str, str]:
    return launcher_free_environ(RUN_ENV)


def _held_env(checkpoint: str) -> dict[str, str]:
    """The environment of a run that holds at :data:`HOLD_AT` until the test's stop signal."""
    return {**_env(), "PYTHONPATH": f"{HOLD}{os.pathsep}{REPO / 'src'}",
            "UNIRANK_TEST_HOLD_AT": str(HOLD_AT), "UNIRANK_TEST_HOLD_CHECKPOINT": checkpoint}


def _digest(stdout: str) -> str:
    digests = {rank: digest for rank, digest in DIGEST.findall(stdout)}
    assert sorted(digests) == ["0", "1"] and len(set(digests.values())) == 1, stdout
    return next(iter(digests.values()))


@pytest.fixture(scope="module")
def unbroken() -> str:
    """The parameters' fingerprint after an unbroken run (``unirank run -n 2``, gloo)."""
    done = Runner(REPO).run(["-n", "2", TRAIN, *ARGS], env=RUN_ENV, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    return _digest(done.stdout)


def _run(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return Runner(REPO).run(["-n", "2", *args], env=RUN_ENV, timeout=TIMEOUT)


@pytest.mark.parametrize(("every", "signal_rank", "signal_step", "stop_step"),
                         [(1, 1, 5, 5), (1, 0, 2, 2), (4, 1, 6, 9)])
def test_every_rank_stops_at_the_same_step(every: int, signal_rank: int, signal_step: int,
                                           stop_step: int) -> None:
    """One rank signals itself (SIGUSR2) after a step: every rank's ``stop_requested`` turns
    True at the same call (with ``every=4``: the next call that asks the others); the handlers
    that were there before are back afterwards."""
    done = _run([STOP_JOB, "--every", str(every), "--signal-rank", str(signal_rank),
                 "--signal-step", str(signal_step)])
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        assert f"rank {rank} watches ['SIGTERM', 'SIGUSR2']" in done.stdout
        assert f"rank {rank} stopped after step {stop_step}\n" in done.stdout, done.stdout
        assert f"rank {rank} handler restored: True" in done.stdout


def _position(step: int) -> tuple[int, int]:
    """The (epoch, batch) train.py saves after ``step`` steps (8 per epoch): the batch after
    the last one done, in the epoch of that step (8 once it ended the epoch)."""
    epoch, done = divmod(step - 1, 8)
    return epoch, done + 1


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as file:
        return [int(child) for child in file.read().split()]


def _workers(pid: int) -> list[int]:
    """The workers of the ``unirank run`` ``pid``: the children of its fork server, or its own
    children when workers start as their own interpreters."""
    found = []
    for child in _children(pid):
        with open(f"/proc/{child}/cmdline", "rb") as file:
            forks = b"unirank.supervisor.fork.server" in file.read()
        found += _children(child) if forks else [child]
    return found


def _stop_when_held(cmd: Sequence[str], checkpoint: str,
                    send: Callable[[subprocess.Popen[bytes]], None]) -> tuple[int, str, str]:
    """Start ``cmd`` holding at :data:`HOLD_AT`; once rank 0 says ``HOLDING``, ``send`` the stop
    signal; return the exit code, stdout and stderr."""
    proc = subprocess.Popen(list(cmd), cwd=REPO, env=_held_env(checkpoint),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        seen = _read_until(proc, "HOLDING", TIMEOUT)
        send(proc)
        rest, errb = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, seen + rest.decode(), errb.decode()


def _to_worker(index: int) -> Callable[[subprocess.Popen[bytes]], None]:
    """Send SIGUSR2 to one of the two workers of ``unirank run``."""
    def send(proc: subprocess.Popen[bytes]) -> None:
        workers = _workers(proc.pid)
        assert len(workers) == 2, workers
        os.kill(workers[index], signal.SIGUSR2)
    return send


def test_sigusr2_under_unirank_run_stops_saves_exits_79_and_a_rerun_resumes(
    tmp_path: Path, unbroken: str,
) -> None:
    """A worker gets SIGUSR2 mid-training: both ranks stop after the same step, the checkpoint
    is saved, every worker exits 79 and ``unirank run`` says so in one line (no failure
    summary) and exits 79. The same command again resumes after that step and ends with the
    unbroken run's parameters."""
    checkpoint = str(tmp_path / "ck.pt")
    cmd = Runner.command(["-n", "2", TRAIN, *ARGS, "--checkpoint", checkpoint])
    code, out, err = _stop_when_held(cmd, checkpoint, _to_worker(-1))
    assert code == REQUEUE_EXIT_CODE, f"{out}\n{err}"
    assert err.strip().splitlines()[-1] == (
        "unirank run: stopped to be requeued (exit code 79): ranks 0-1 saved and stopped so "
        "that the run goes on later; not a failure"), err
    assert "FAILED" not in err and "Traceback" not in err, err
    stopped = re.search(r"^stopped at step (\d+): checkpoint saved to ", out, re.MULTILINE)
    assert stopped, out
    steps = {rank: [s for s in STEP.findall(out) if s[0] == rank] for rank in "01"}
    assert len(steps["0"]) == len(steps["1"]) == int(stopped.group(1)), steps  # the same step
    again = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True,
                           timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert again.returncode == 0, again.stderr
    epoch, batch = _position(int(stopped.group(1)))
    assert (f"resumed from {checkpoint} at epoch {epoch}, batch {batch} "
            f"(step {stopped.group(1)})") in again.stdout, again.stdout
    first = STEP.findall(again.stdout)[0]
    assert (int(first[1]), int(first[2]) // 8) == divmod(int(stopped.group(1)), 8), \
        again.stdout  # the step after the last one done: no step twice, none left out
    assert _digest(again.stdout) == unbroken


def test_max_restarts_restarts_a_group_stopped_for_requeue_outside_slurm(
    tmp_path: Path, unbroken: str,
) -> None:
    """``unirank run --max-restarts 1`` outside Slurm: the workers stopped by SIGUSR2 exit 79,
    the group is started again (one restart), resumes from the checkpoint and ends 0 with the
    unbroken run's parameters."""
    checkpoint = str(tmp_path / "ck.pt")
    code, out, err = _stop_when_held(
        Runner.command(["-n", "2", "--max-restarts", "1", TRAIN, *ARGS, "--checkpoint",
                        checkpoint]), checkpoint, _to_worker(0))
    assert code == 0, f"{out}\n{err}"
    assert ("unirank run: attempt 0 stopped to be requeued (exit code 79); restarting the "
            "workers (1 of 1 restarts)") in err, err
    assert "resumed from" in out and _digest(out) == unbroken


def test_spawned_workers_stopped_by_sigusr2_end_the_script_with_79(tmp_path: Path) -> None:
    """``python train.py --nproc_per_node 2``: SIGUSR2 to the script reaches its spawned workers
    (``ur.Parallel`` forwards it); they save and stop at the same step, and the script exits 79
    after one line, without a traceback."""
    checkpoint = str(tmp_path / "ck.pt")
    code, out, err = _stop_when_held(
        [PY, TRAIN, "--nproc_per_node", "2", *ARGS, "--checkpoint", checkpoint], checkpoint,
        lambda proc: proc.send_signal(signal.SIGUSR2))
    assert code == REQUEUE_EXIT_CODE, f"{out}\n{err}"
    assert "unirank Parallel: stopped to be requeued (exit code 79)" in err, err
    assert "Traceback" not in err and "stopped at step" in out, err


def _read_until(proc: subprocess.Popen[bytes], marker: str, timeout: float) -> str:
    """stdout of ``proc`` up to a chunk holding ``marker``, read unbuffered (what is not read
    yet stays in the pipe for ``communicate``); fails after ``timeout``."""
    return read_stdout_until(proc, lambda seen: marker.encode() in seen, timeout,
                             repr(marker)).decode()


# --- THE preemption test on the Slurm testbed ------------------------------------------------


@pytest.mark.slurm
@pytest.mark.parametrize("launch", ["tasks", "node"])
def test_preempted_job_checkpoints_requeues_resumes_and_matches_an_unbroken_run(
    slurm_testbed: SlurmTestbed, unbroken: str, launch: str,
) -> None:
    """``unirank sbatch --requeue`` on two nodes; once the first run holds at a step (see
    :data:`HOLD`),
    ``scancel --signal=USR2`` signals the job's steps (their tasks: the ranks, or with
    ``--launch node`` the ``unirank run`` of each node, which forwards it). The job saves,
    rank 0 requeues it, it starts again (Restarts=1, released from Slurm's hold by the test),
    logs where it resumed, finishes with the unbroken run's parameters, and its one log holds
    both runs."""
    checkpoint = slurm_testbed.work_dir / f"preempt-{launch}.pt"
    checkpoint.unlink(missing_ok=True)
    following, job = start(slurm_testbed, [
        "-N", "2", "--ntasks-per-node", "1", "--launch", launch, "--requeue", "--follow",
        "--env", "UNIRANK_INIT_TIMEOUT=60",
        *(f"--env={name}={value}" for name, value in _held_env(str(checkpoint)).items()
          if name == "PYTHONPATH" or name.startswith("UNIRANK_TEST_HOLD")),
        "--", TRAIN, *ARGS, "--checkpoint", str(checkpoint)], minutes=6)
    try:
        following.wait_for("^HOLDING")  # the first run holds at HOLD_AT until the signal
        subprocess.run(["scancel", "--signal=USR2", str(job)], check=True, timeout=30,
                       capture_output=True)
        signalled = time.monotonic()
        slurm_testbed.release_requeued(job)
        released = time.monotonic()
        following.wait_for("^resumed from")
        resumed = time.monotonic()
    finally:
        done = following.finish()
    print(f"\n[{launch}] signal -> requeued job released: {released - signalled:.1f} s; "
          f"signal -> resumed line: {resumed - signalled:.1f} s")
    full = done
    out = done.stdout
    assert done.returncode == 0, _described(full)
    stopped = re.search(r"stopped at step (\d+): checkpoint saved to ", out)
    assert stopped, _described(full)
    assert f"requeueing job {job}" in out, _described(full)
    epoch, batch = _position(int(stopped.group(1)))
    assert f"at epoch {epoch}, batch {batch} (step {stopped.group(1)})" in out, _described(full)
    assert _digest(out) == unbroken
    assert f"unirank sbatch: job {job} was requeued (restart 1)" in done.stderr
    shown = subprocess.run(["scontrol", "show", "job", "-o", str(job)], capture_output=True,
                           text=True, timeout=30).stdout
    assert " Restarts=1 " in shown, shown
    log = Path(re.search(r"StdOut=(\S+)", shown).group(1)).read_text()  # type: ignore[union-attr]
    assert "stopped at step" in log and "resumed from" in log  # both runs in the one log


def _start_held(testbed: SlurmTestbed, launch: str, tag: str,
                extra: Sequence[str] = ()) -> tuple[Any, int, Path]:
    """``unirank sbatch --requeue --follow`` of train.py on two nodes, holding at
    :data:`HOLD_AT` on its first run (see :data:`HOLD`); the follower, job id and checkpoint."""
    checkpoint = testbed.work_dir / f"{tag}-{launch}.pt"
    checkpoint.unlink(missing_ok=True)
    following, job = start(testbed, [
        "-N", "2", "--ntasks-per-node", "1", "--launch", launch, "--requeue", *extra,
        "--follow", "--env", "UNIRANK_INIT_TIMEOUT=60",
        *(f"--env={name}={value}" for name, value in _held_env(str(checkpoint)).items()
          if name == "PYTHONPATH" or name.startswith("UNIRANK_TEST_HOLD")),
        "--", TRAIN, *ARGS, "--checkpoint", str(checkpoint)], minutes=6)
    return following, job, checkpoint


def _job_line(job: int) -> str:
    return subprocess.run(["scontrol", "show", "job", "-o", str(job)], capture_output=True,
                          text=True, timeout=30).stdout


def _resumed_run(testbed: SlurmTestbed, launch: str, tag: str, stop: Sequence[str],
                 extra: Sequence[str] = ()) -> tuple[subprocess.CompletedProcess[str], int]:
    """Hold the first run, run ``stop`` (JOBID appended), release the requeued job and follow
    it to its end: the finished ``unirank sbatch --follow`` and the job id."""
    following, job, _checkpoint = _start_held(testbed, launch, tag, extra)
    try:
        following.wait_for("^HOLDING")
        subprocess.run([*stop, str(job)], check=True, timeout=30, capture_output=True)
        testbed.release_requeued(job)
        following.wait_for("^resumed from")
    finally:
        done = following.finish()
    return done, job


def _check_resumed(done: subprocess.CompletedProcess[str], job: int, unbroken: str) -> str:
    """The job stopped after saving, ran again from the checkpoint and matches an unbroken
    run; its log (returned) holds both runs."""
    out = done.stdout
    assert done.returncode == 0, _described(done)
    stopped = re.search(r"stopped at step (\d+): checkpoint saved to ", out)
    assert stopped, _described(done)
    epoch, batch = _position(int(stopped.group(1)))
    assert f"at epoch {epoch}, batch {batch} (step {stopped.group(1)})" in out, _described(done)
    assert _digest(out) == unbroken
    assert f"unirank sbatch: job {job} was requeued (restart 1)" in done.stderr
    shown = _job_line(job)
    assert " Restarts=1 " in shown, shown
    return Path(re.search(r"StdOut=(\S+)", shown).group(1)).read_text()  # type: ignore[union-attr]


@pytest.mark.slurm
@pytest.mark.parametrize("launch", ["tasks", "node"])
def test_scontrol_requeue_saves_the_checkpoint_first_and_the_job_resumes_from_it(
    slurm_testbed: SlurmTestbed, unbroken: str, launch: str,
) -> None:
    """An administrator's ``scontrol requeue JOBID`` (Slurm's SIGTERM to every process of the
    job, SIGKILL KillWait seconds later, as preemption with PreemptMode=REQUEUE does): the
    ranks save their checkpoint before the job stops, rank 0 leaves the requeue to Slurm, and
    the requeued job resumes from the checkpoint and ends with an unbroken run's parameters.
    The log says "stopped to be requeued (exit code 79)", not a failure."""
    done, job = _resumed_run(slurm_testbed, launch, "admin-requeue", ["scontrol", "requeue"])
    log = _check_resumed(done, job, unbroken)
    assert (f"unirank: stopped to be requeued (exit code {REQUEUE_EXIT_CODE}); Slurm requeues "
            f"job {job}") in log, log
    if launch == "node":
        assert "unirank run: stopped to be requeued (exit code 79)" in log, log
    for failure in ("Terminated", "SIGTERM", "FAILED", "Traceback", "requeue failed",
                    "forcing job termination", "Job step aborted"):
        assert failure not in log, log


@pytest.mark.slurm
def test_batch_signal_is_forwarded_to_the_ranks_which_save_and_requeue(
    slurm_testbed: SlurmTestbed, unbroken: str,
) -> None:
    """``--signal B:USR2@60`` sends the warning to the batch shell alone; the script's trap
    passes it to srun, which passes it to the ranks: they save, requeue and resume
    (``scancel --batch --signal=USR2`` is what Slurm does at the warning time)."""
    done, job = _resumed_run(slurm_testbed, "tasks", "batch-signal",
                             ["scancel", "--batch", "--signal=USR2"],
                             ["--signal", "B:USR2@60"])
    log = _check_resumed(done, job, unbroken)
    assert f"requeueing job {job}" in log, log


@pytest.mark.slurm
@pytest.mark.parametrize("launch", ["tasks", "node"])
def test_another_warning_signal_is_a_stop_signal_of_the_ranks_which_save_and_requeue(
    slurm_testbed: SlurmTestbed, unbroken: str, launch: str,
) -> None:
    """``--signal USR1@60``: the script exports it to the ranks as a stop signal
    (UNIRANK_STOP_SIGNALS=USR1,TERM), so ``scancel --signal=USR1`` (what Slurm sends at the
    warning time, to every process of the steps: the ranks, and with ``--launch node`` each
    node's ``unirank run`` and its helpers) makes them save and requeue; before, it killed
    every rank (issue 33)."""
    done, job = _resumed_run(slurm_testbed, launch, "usr1-warning",
                             ["scancel", "--signal=USR1"], ["--signal", "USR1@60"])
    log = _check_resumed(done, job, unbroken)
    assert f"requeueing job {job}" in log, log
    for failure in ("User defined signal", "FAILED", "Traceback", "rendezvous helper"):
        assert failure not in log, log


@pytest.mark.slurm
@pytest.mark.parametrize("launch", ["tasks", "node"])
def test_scancel_saves_the_checkpoint_and_the_job_is_not_requeued(
    slurm_testbed: SlurmTestbed, launch: str,
) -> None:
    """A user's ``scancel JOBID`` (SIGTERM, like a requeue): the ranks save their checkpoint,
    say that the job ends without a requeue, and the job stays CANCELLED with Restarts=0."""
    following, job, checkpoint = _start_held(slurm_testbed, launch, "scancel")
    try:
        following.wait_for("^HOLDING")
        subprocess.run(["scancel", str(job)], check=True, timeout=30, capture_output=True)
    finally:
        done = following.finish()
    assert f"unirank sbatch: job {job} CANCELLED" in done.stderr, _described(done)
    assert "stopped at step" in done.stdout and checkpoint.is_file(), _described(done)
    assert (f"unirank: stopped after the checkpoint; Slurm is ending job {job} without a "
            "requeue") in done.stdout, _described(done)
    assert "requeueing job" not in done.stdout and "was requeued" not in done.stderr
    shown = _job_line(job)
    assert " JobState=CANCELLED " in shown and " Restarts=0 " in shown, shown


@pytest.mark.slurm
def test_a_requeued_job_resumes_its_state_at_the_last_saved_step_with_no_step_lost(
    slurm_testbed: SlurmTestbed,
) -> None:
    """``unirank sbatch --requeue`` of a loop that keeps its state with ``ur.save_state`` at
    every step (to memory; the folder only every 10th step) and ends for the requeue when
    asked, saving nothing more: ``scancel --signal=USR2`` after step 3. Each node's
    ``unirank run`` copies the newest step it holds whole to the folder as it ends; the
    requeued job restores step 3, bit for bit, and goes on at step 4: no step lost."""
    folder = slurm_testbed.work_dir / "state-requeue"
    following, job = start(slurm_testbed, [
        "-N", "2", "--ntasks-per-node", "1", "--launch", "node", "--requeue", "--follow",
        "--env", "UNIRANK_INIT_TIMEOUT=60", f"--env=PYTHONPATH={REPO / 'src'}",
        "--", STATE_REQUEUE, str(folder), "8", "3"], minutes=6)
    try:
        following.wait_for("^HOLDING")
        subprocess.run(["scancel", "--signal=USR2", str(job)], check=True, timeout=30,
                       capture_output=True)
        slurm_testbed.release_requeued(job)
        following.wait_for("^restored step 3")
    finally:
        done = following.finish()
    out = done.stdout
    assert done.returncode == 0, _described(done)
    assert "stopped after step 3" in out, _described(done)
    assert "restored step 3: w=4.0" in out, _described(done)  # step 3's state, bit for bit
    assert "saved step 4" in out and "done: w=8.0" in out, _described(done)
    assert f"unirank sbatch: job {job} was requeued (restart 1)" in done.stderr
