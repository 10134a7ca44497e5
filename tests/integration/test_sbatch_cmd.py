"""``unirank sbatch --submit --follow`` on the two-node testbed: real sbatch, real jobs.

Each test runs the ``unirank`` command in a clean environment (no outer job's variables) from
the repository root, with a job name that carries the session's prefix (the testbed fixture
cancels and reports anything left queued), a ``--time`` limit, an output file in the fixture's
work folder, and a subprocess timeout after which the job is cancelled.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import pytest

from unirank.exitcodes import REQUEUE as REQUEUE_EXIT_CODE

if TYPE_CHECKING:
    from conftest import SlurmTestbed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _outputs import JOB_ENV, REPO, check_world, parse_hello, slurm_port

from _procs import launcher_free_environ

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

TIMEOUT = 180.0
_SUBMITTED = re.compile(r"^Submitted batch job (\d+)$", re.MULTILINE)


def _conftest(testbed: SlurmTestbed) -> Any:
    """tests/conftest.py as loaded (it cannot be imported: --import-mode=importlib)."""
    return sys.modules[type(testbed).__module__]


def _prefix(testbed: SlurmTestbed) -> str:
    """The session's job-name prefix: the fixture cancels and reports jobs left with it."""
    return str(_conftest(testbed).JOB_NAME_PREFIX)


def _command(testbed: SlurmTestbed, args: Sequence[str], minutes: int = 3) -> tuple[list[str], str]:
    name = f"{_prefix(testbed)}{uuid.uuid4().hex[:8]}"
    output = testbed.work_dir / "%x-%j.out"
    cmd = [sys.executable, "-m", "unirank", "sbatch", "-J", name, "-t", str(minutes),
           "-o", str(output), "--submit", *args]
    return cmd, name


def _env(extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    env = launcher_free_environ({**JOB_ENV, **(extra or {})})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"),
                                                      os.environ.get("PYTHONPATH")]))
    return env


def submit(testbed: SlurmTestbed, args: Sequence[str], timeout: float = TIMEOUT,
           minutes: int = 3) -> subprocess.CompletedProcess[str]:
    """``unirank sbatch ... --submit ARGS`` to its end; the job is cancelled on a timeout."""
    cmd, name = _command(testbed, args, minutes)
    try:
        return subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        _conftest(testbed)._cancel_by_name(name)  # scancel, then wait until it left the queue
        raise AssertionError(f"{' '.join(cmd)} did not end in {timeout:g} s; job cancelled\n"
                             f"stdout:\n{exc.stdout!r}\nstderr:\n{exc.stderr!r}") from None


def job_id_of(done: subprocess.CompletedProcess[str]) -> int:
    match = _SUBMITTED.search(done.stdout)
    assert match, f"no job id in:\n{done.stdout}\n{done.stderr}"
    return int(match.group(1))


def _described(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\n--- stdout ---\n{done.stdout}\n--- stderr ---\n{done.stderr}"


def _script(testbed: SlurmTestbed, name: str, text: str) -> str:
    path = testbed.work_dir / name
    path.write_text(text)
    return str(path)


def test_follow_prints_the_four_hellos_of_two_nodes_and_exits_0(
    slurm_testbed: SlurmTestbed,
) -> None:
    done = submit(slurm_testbed, ["--nodes", "2", "--ntasks-per-node", "2", "--follow", "--",
                                  "examples/helloworld.py", "--backend", "gloo"])
    assert done.returncode == 0, _described(done)
    job = job_id_of(done)
    check_world(parse_hello(done.stdout), 4, addr="node1", port=slurm_port(job, 0),
                nodes=["node1", "node1", "node2", "node2"], context=_described(done))
    assert f"unirank sbatch: job {job} COMPLETED, exit code 0" in done.stderr


FAILING = """\
import unirank as ur

env = ur.dist_env()
if env.rank == 1:
    raise RuntimeError("rank 1 fails on purpose")
print(f"rank {env.rank} done", flush=True)
"""


def test_follow_exits_non_zero_naming_the_rank_that_raised(slurm_testbed: SlurmTestbed) -> None:
    script = _script(slurm_testbed, "fails_on_rank1.py", FAILING)
    done = submit(slurm_testbed, ["-N", "2", "--ntasks-per-node", "2", "--launch", "tasks",
                                  "--follow", script])
    assert done.returncode == 1, _described(done)
    job = job_id_of(done)
    assert "RuntimeError: rank 1 fails on purpose" in done.stdout, _described(done)
    assert (f"unirank sbatch: job {job} FAILED, exit code 1: rank 1 (node1): Exited with exit "
            "code 1") in done.stderr, _described(done)


def test_node_launch_with_explicit_env_runs_unirank_run_per_node(
    slurm_testbed: SlurmTestbed,
) -> None:
    """``--launch node``: one ``unirank run --nproc-per-node 2`` per node; the written-out
    MASTER_ADDR/MASTER_PORT are the values the ranks use, and those unirank derives itself."""
    done = submit(slurm_testbed, ["-N", "2", "--ntasks-per-node", "2", "--launch", "node",
                                  "--explicit-env", "--follow", "examples/helloworld.py"])
    assert done.returncode == 0, _described(done)
    job = job_id_of(done)
    port = slurm_port(job, 0)
    assert f"unirank sbatch: MASTER_ADDR=node1 MASTER_PORT={port}\n" in done.stdout
    check_world(parse_hello(done.stdout), 4, addr="node1", port=port,
                nodes=["node1", "node1", "node2", "node2"], context=_described(done))


PLAIN_TORCHRUN = """\
import os
import socket

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
print(f"plain rank {dist.get_rank()} local {os.environ['LOCAL_RANK']} of "
      f"{dist.get_world_size()} on {socket.gethostname()} {os.environ.get('SLURMD_NODENAME')} "
      f"sum {int(total.item())}", flush=True)
dist.destroy_process_group()
"""


def test_a_plain_torchrun_script_runs_with_every_default(slurm_testbed: SlurmTestbed) -> None:
    """Issue 34: a script written for torchrun (no unirank import, ``init_process_group`` from
    RANK, WORLD_SIZE, MASTER_ADDR...) submitted with ``unirank sbatch``'s defaults: every rank
    of the 2 x 2 world joins and the all_reduce sums 4."""
    script = _script(slurm_testbed, "plain_torchrun.py", PLAIN_TORCHRUN)
    done = submit(slurm_testbed, ["-N", "2", "--ntasks-per-node", "2", "--follow", script])
    assert done.returncode == 0, _described(done)
    lines = sorted(re.findall(r"^plain rank (\d) local (\d) of (\d) on \S+ (\S+) sum (\d)$",
                              done.stdout, re.MULTILINE))
    assert lines == [("0", "0", "4", "node1", "4"), ("1", "1", "4", "node1", "4"),
                     ("2", "0", "4", "node2", "4"), ("3", "1", "4", "node2", "4")], \
        _described(done)
    assert "RANK expected" not in done.stdout + done.stderr


REQUEUE_ONCE = f"""\
import os
import sys

restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
print(f"task {{os.environ['SLURM_PROCID']}} run {{restart}}", flush=True)
sys.exit({REQUEUE_EXIT_CODE} if restart == 0 else 0)
"""


class Following:
    """A started ``unirank sbatch --submit --follow``: its output read as it comes, by one
    thread per stream (unbuffered, so nothing waits in a buffer that a wait cannot see)."""

    def __init__(self, testbed: SlurmTestbed, proc: subprocess.Popen[bytes], name: str) -> None:
        self.testbed, self.proc, self.name = testbed, proc, name
        self._changed = threading.Condition()
        self._data: dict[str, bytes] = {"out": b"", "err": b""}
        self._readers = [threading.Thread(target=self._read, args=(key, stream), daemon=True)
                         for key, stream in (("out", proc.stdout), ("err", proc.stderr))]
        for reader in self._readers:
            reader.start()

    def _read(self, key: str, stream: Any) -> None:
        while chunk := os.read(stream.fileno(), 65536):
            with self._changed:
                self._data[key] += chunk
                self._changed.notify_all()
        with self._changed:
            self._data[key + " closed"] = b""
            self._changed.notify_all()

    @property
    def stdout(self) -> str:
        with self._changed:
            return self._data["out"].decode(errors="replace")

    def wait_for(self, pattern: str, timeout: float = TIMEOUT) -> re.Match[str]:
        """The first match of ``pattern`` in stdout, waiting up to ``timeout`` for it."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                match = re.search(pattern, self._data["out"].decode(errors="replace"),
                                  re.MULTILINE)
                if match:
                    return match
                left = deadline - time.monotonic()
                if "out closed" in self._data or left <= 0:
                    out, err = (self._data[k].decode(errors="replace") for k in ("out", "err"))
                    why = "stdout closed" if left > 0 else f"{timeout:g} s passed"
                    raise AssertionError(f"no {pattern!r} ({why}):\n{out}\n--- stderr ---\n"
                                         f"{err}")
                self._changed.wait(left)

    def finish(self, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
        """Wait for the end; on a timeout kill it, cancel the job and fail."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            _conftest(self.testbed)._cancel_by_name(self.name)
            raise AssertionError(f"unirank sbatch did not end in {timeout:g} s; job cancelled"
                                 f"\n{self.stdout}") from None
        for reader in self._readers:
            reader.join(timeout=30)
        out, err = (self._data[k].decode(errors="replace") for k in ("out", "err"))
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)


def start(testbed: SlurmTestbed, args: Sequence[str],
          minutes: int = 3) -> tuple[Following, int]:
    """``unirank sbatch ... --submit --follow ARGS`` started, and the job's id."""
    cmd, name = _command(testbed, args, minutes)
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    following = Following(testbed, proc, name)
    try:
        job = int(following.wait_for(_SUBMITTED.pattern).group(1))
    except AssertionError:
        proc.kill()
        following.finish()
        _conftest(testbed)._cancel_by_name(name)
        raise
    return following, job


def test_requeue_exit_code_requeues_from_the_batch_shell_and_follow_spans_both_runs(
    slurm_testbed: SlurmTestbed,
) -> None:
    """Every task exits with REQUEUE_EXIT_CODE on the first run: the batch shell requeues the
    job (Restarts=1); the second run ends 0. ``--follow`` streams both runs from the one
    appended log and ends 0. (The test releases the requeued job from Slurm's hold.)"""
    script = _script(slurm_testbed, "requeue_once.py", REQUEUE_ONCE)
    following, job = start(slurm_testbed, ["-N", "2", "--requeue", "--signal", "USR2@30",
                                           "--launch", "tasks", "--follow", script], minutes=6)
    try:
        slurm_testbed.release_requeued(job)
    finally:
        done = following.finish()
    assert done.returncode == 0, _described(done)
    runs = sorted(re.findall(r"^task (\d) run (\d)$", done.stdout, re.MULTILINE))
    assert runs == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")], _described(done)
    assert f"requeueing job {job}" in done.stdout
    assert f"unirank sbatch: job {job} was requeued (restart 1)" in done.stderr
    shown = subprocess.run(["scontrol", "show", "job", "-o", str(job)], capture_output=True,
                           text=True, timeout=30).stdout
    assert " Restarts=1 " in shown, shown


WAITS = """\
import threading

print("job is running", flush=True)
threading.Event().wait(300)
"""


def _read_until(proc: subprocess.Popen[str], marker: str, timeout: float) -> str:
    """stderr of ``proc`` up to the line holding ``marker`` (fails after ``timeout``)."""
    assert proc.stderr is not None
    seen = ""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} after {timeout:g} s; stderr so far:\n{seen}"
        ready, _, _ = select.select([proc.stderr], [], [], left)
        if ready:
            line = proc.stderr.readline()
            assert line, f"stderr closed before {marker!r}:\n{seen}"
            seen += line
    return seen


def test_ctrl_c_without_a_terminal_detaches_and_the_job_keeps_running(
    slurm_testbed: SlurmTestbed,
) -> None:
    script = _script(slurm_testbed, "waits.py", WAITS)
    cmd, name = _command(slurm_testbed, ["--follow", script])
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _read_until(proc, "RUNNING", TIMEOUT)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
        # 130, as the shell's for SIGINT: `... --follow && next` does not go on
        assert proc.returncode == 130, f"{stdout}\n{stderr}"
        job = job_id_of(subprocess.CompletedProcess(cmd, 0, stdout, stderr))
        assert f"detached; job {job} keeps running: " in stderr, stderr
        assert f", scancel {job} stops it" in stderr, stderr
        state = subprocess.run(["squeue", "-h", "-o", "%T", "-j", str(job)],
                               capture_output=True, text=True, timeout=30).stdout.strip()
        assert state == "RUNNING", state
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        _conftest(slurm_testbed)._cancel_by_name(name)  # scancel, then wait until it is gone


ELASTIC_STEPS = str(REPO / "tests" / "integration" / "scripts" / "elastic_steps.py")


def _launcher_on(node: str, marker: str) -> int:
    """The pid of the ``python -m unirank run`` (not its srun) on the testbed node ``node``
    whose command line holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[1:4] == [b"-m", b"unirank", b"run"] and marker.encode() in argv \
                and f"SLURMD_NODENAME={node}".encode() in environ:
            found.append(int(entry.name))
    assert len(found) == 1, f"unirank run on {node}: {found}"
    return found[0]


def test_an_elastic_job_loses_node2_and_node1_finishes_alone(
    slurm_testbed: SlurmTestbed,
) -> None:
    """``--nnodes 1:2 --max-restarts 3``: node2's ``unirank run`` is SIGKILLed while the world
    of 4 trains; node1 notices, restarts alone at a world of 2 and finishes; the job (whose
    status is node1's) completes with exit code 0, and node1's lines name the lost node."""
    steps = "60"
    marker = f"{ELASTIC_STEPS}"
    following, job = start(slurm_testbed, [
        "--nnodes", "1:2", "--ntasks-per-node", "2", "--max-restarts", "3", "--rdzv-conf",
        "join_timeout=60,last_call_timeout=10", "--follow", ELASTIC_STEPS, steps], minutes=4)
    try:
        following.wait_for(r"^step 1 rank 2 world 4 sum 4 restart 0$")
        os.kill(_launcher_on("node2", marker), signal.SIGKILL)
    finally:
        done = following.finish()
    assert done.returncode == 0, _described(done)
    assert f"unirank sbatch: job {job} COMPLETED, exit code 0" in done.stderr, _described(done)
    assert "unirank run: rendezvous round 1: node rank 0 of 1, 2 workers in all " \
           "(left: node2)" in done.stdout, _described(done)
    assert "unirank run: succeeded after 1 restart" in done.stdout, _described(done)
    last = int(steps) - 1
    assert sorted(re.findall(rf"^step {last} rank (\d) world (\d) sum \d restart 1$",
                             done.stdout, re.MULTILINE)) == [("0", "2"), ("1", "2")], \
        _described(done)


def test_an_elastic_job_loses_node1_and_node2_takes_the_rendezvous_over(
    slurm_testbed: SlurmTestbed,
) -> None:
    """``--nnodes 1:2 --max-restarts 3``: node1's ``unirank run`` (it serves the rendezvous,
    and runs rank 0) is SIGKILLed while the world of 4 trains; node2 takes the rendezvous over,
    restarts alone at a world of 2 and finishes; the job's status is then node2's: 0."""
    steps = "60"
    following, job = start(slurm_testbed, [
        "--nnodes", "1:2", "--ntasks-per-node", "2", "--max-restarts", "3", "--rdzv-conf",
        "join_timeout=60,last_call_timeout=10", "--follow", ELASTIC_STEPS, steps], minutes=4)
    try:
        following.wait_for(r"^step 1 rank 2 world 4 sum 4 restart 0$")
        os.kill(_launcher_on("node1", ELASTIC_STEPS), signal.SIGKILL)
    finally:
        done = following.finish()
    assert done.returncode == 0, _described(done)
    assert f"unirank sbatch: job {job} COMPLETED, exit code 0" in done.stderr, _described(done)
    assert "unirank run: store moved to node node2" in done.stdout, _described(done)
    assert "unirank run: rendezvous round 1: node rank 0 of 1, 2 workers in all " \
           "(left: node1)" in done.stdout, _described(done)
    last = int(steps) - 1
    assert sorted(re.findall(rf"^step {last} rank (\d) world (\d) sum \d restart 1$",
                             done.stdout, re.MULTILINE)) == [("0", "2"), ("1", "2")], \
        _described(done)
