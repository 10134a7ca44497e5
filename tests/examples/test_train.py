"""``examples/train.py`` is launcher-independent: with ``--seed 7`` and world size 2 the last
logged loss of rank 0 is the same (within 1e-5, relative) spawned from python, under torchrun,
under ``unirank run``, under srun on the testbed's two nodes, under sbatch and under mpirun; and
after training the parameters are bit-identical on every rank of a run.

With ``--backend horovod`` (Horovod 0.28.1, ``scripts/setup --horovod``) the last loss equals the
gloo run's within 1e-4 spawned, under ``horovodrun --gloo`` and under srun on two nodes (no
horovodrun, no MPI). With ``--backend xla-tpu`` (``.venv-xla``, XLA:CPU, world size 1) it trains
and its losses equal the CPU run's of the same environment; asking for two XLA:CPU processes
fails at once, naming the upstream issue.

Real launchers, real processes, real gloo, Horovod and torch_xla.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_examples import EXAMPLES, run

from _procs import Runner, free_port, launcher_free_environ, process_tree, read_lines

pytestmark = pytest.mark.integration

TRAIN = str(EXAMPLES / "train.py")
ARGS = ["--seed", "7", "--nb_samples", "64", "--batch_size", "16", "--log_interval", "1"]
# workers may share one stdout unbuffered: a line can be glued to the next, so match the number
LOG = re.compile(r"Process (\d+)/(\d+) Train Epoch: (\d+) \[(\d+)/(\d+)\]\t"
                 r"Loss: (\d+\.\d+(?:e[-+]?\d+)?)")
DIGEST = re.compile(r"Process (\d+)/(\d+) parameters ([0-9a-f]{16})")

def _check(stdout: str, world: int = 2) -> float:
    """The run's last rank-0 loss, after checking the seed's lines and the replicas' digests."""
    logs = LOG.findall(stdout)
    assert logs, stdout
    assert {(r, w) for r, w, *_ in logs} == {(str(r), str(world)) for r in range(world)}
    # 64 samples, 16 per step over 2 ranks: batches 0..3 of 8, [N/M] as the seed prints it
    rank0 = [entry for entry in logs if entry[0] == "0"]
    assert [(n, m) for _, _, _, n, m, _ in rank0] == [("0", "64"), ("8", "64"), ("16", "64"),
                                                      ("24", "64")]
    digests = {rank: digest for rank, _, digest in DIGEST.findall(stdout)}
    assert sorted(digests) == [str(r) for r in range(world)]
    assert len(set(digests.values())) == 1, digests  # bit-identical replicas
    return float(rank0[-1][5])


@pytest.fixture(scope="module")
def reference() -> float:
    """The last rank-0 loss of the run spawned from python (trained once for the module): the
    loss every other launcher's run must end with."""
    return _check(run([sys.executable, TRAIN, "--nproc_per_node", "2", *ARGS]).stdout)


def _same_loss(name: str, loss: float, reference: float, rel_tol: float = 1e-5) -> None:
    assert math.isclose(loss, reference, rel_tol=rel_tol), (name, loss, reference)


def test_spawned_from_python(reference: float) -> None:
    """The spawned run logged the seed's lines with bit-identical replicas (``_check``), and
    its loss is a finite, positive number."""
    assert math.isfinite(reference) and reference > 0, reference


def test_under_torchrun(reference: float) -> None:
    torchrun = shutil.which("torchrun")
    assert torchrun, "torchrun comes with torch"
    out = run([torchrun, "--standalone", "--nproc_per_node", "2", TRAIN, *ARGS]).stdout
    _same_loss("torchrun", _check(out), reference)


def test_under_unirank_run(reference: float) -> None:
    out = run(Runner.command(["-n", "2", TRAIN, *ARGS])).stdout
    _same_loss("unirank run", _check(out), reference)


def test_under_mpirun(mpirun: list[str], reference: float) -> None:
    out = run([*mpirun, "-np", "2", sys.executable, TRAIN, *ARGS]).stdout
    _same_loss("mpirun", _check(out), reference)


def test_under_srun_on_two_nodes(slurm_testbed: Any, reference: float) -> None:
    out = slurm_testbed.srun(["-N2", "--ntasks-per-node=1", sys.executable, TRAIN, *ARGS],
                             timeout=180).stdout
    _same_loss("srun", _check(out), reference)


def test_under_sbatch(slurm_testbed: Any, reference: float) -> None:
    result = slurm_testbed.sbatch_and_wait(
        f"srun {sys.executable} {TRAIN} {' '.join(ARGS)}\n", timeout=180,
        args=["-N2", "--ntasks-per-node=1"],
    )
    assert result.exit_code == 0, result.output
    _same_loss("sbatch", _check(result.output), reference)


def test_checkpoint_resumes_after_the_saved_epoch(tmp_path: Path) -> None:
    """``--epochs`` is the total: two epochs in one run end where one epoch, then the same
    command with ``--epochs 2`` (resumed after the saved epoch), end."""
    checkpoint = tmp_path / "ckpt.pt"
    whole = run([sys.executable, TRAIN, "--nproc_per_node", "2", *ARGS, "--epochs", "2"]).stdout
    first = run([sys.executable, TRAIN, "--nproc_per_node", "2", *ARGS,
                 "--checkpoint", str(checkpoint)]).stdout
    assert checkpoint.exists()
    assert not [p for p in tmp_path.iterdir() if p.name != "ckpt.pt"]  # no temporary left
    second = run([sys.executable, TRAIN, "--nproc_per_node", "2", *ARGS, "--epochs", "2",
                  "--checkpoint", str(checkpoint)]).stdout
    assert f"resumed from {checkpoint} at epoch 1, batch 0 (step 4)" in second
    assert {e for *_, e, _n, _m, _l in LOG.findall(first)} == {"0"}
    assert {e for *_, e, _n, _m, _l in LOG.findall(second)} == {"1"}
    digest = DIGEST.findall(whole)[0][2]
    assert {d for *_, d in DIGEST.findall(second)} == {digest}
    done = run([sys.executable, TRAIN, "--nproc_per_node", "2", *ARGS, "--epochs", "2",
                "--checkpoint", str(checkpoint)]).stdout
    assert not LOG.findall(done) and {d for *_, d in DIGEST.findall(done)} == {digest}


def test_world_one_resumes_mid_epoch_with_the_same_data_order(tmp_path: Path) -> None:
    """At world size 1 (the shuffle of the seed and the epoch, as at any world size): a run
    stopped by SIGUSR2 (plain python, no launcher: it exits 0) and run again ends with the
    unbroken run's parameters."""
    checkpoint = tmp_path / "ckpt.pt"
    args = [sys.executable, TRAIN, *ARGS, "--epochs", "20"]
    whole = run(args).stdout
    proc = subprocess.Popen([*args, "--checkpoint", str(checkpoint)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env=launcher_free_environ())
    try:
        assert proc.stdout is not None
        first = os.read(proc.stdout.fileno(), 65536)  # unbuffered: the rest stays in the pipe
        assert b"Train Epoch: 0 [0/64]" in first, first
        proc.send_signal(signal.SIGUSR2)  # a step is logged: stop at a later step boundary
        rest, errb = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    out, err = (first + rest).decode(), errb.decode()
    assert proc.returncode == 0, err
    assert "stopped after the checkpoint; run the same command again to resume" in err
    stopped = re.search(r"stopped at step (\d+)", out)
    assert stopped, out
    again = run([*args, "--checkpoint", str(checkpoint)]).stdout
    assert f"(step {stopped.group(1)})" in again
    assert DIGEST.findall(again)[0][2] == DIGEST.findall(whole)[0][2]


def test_horovod_spawned(horovodrun: str, reference: float) -> None:
    out = run([sys.executable, TRAIN, "--backend", "horovod", "--nproc_per_node", "2",
               *ARGS]).stdout
    _same_loss("horovod spawned", _check(out), reference, rel_tol=1e-4)


def test_horovod_under_horovodrun(horovodrun: str, reference: float) -> None:
    out = run([horovodrun, "--gloo", "-np", "2", "-H", "localhost:2", sys.executable, TRAIN,
               "--backend", "horovod", *ARGS]).stdout
    _same_loss("horovodrun", _check(out), reference, rel_tol=1e-4)


def test_horovod_under_srun_on_two_nodes(horovodrun: str, slurm_testbed: Any,
                                          reference: float) -> None:
    out = slurm_testbed.srun(["-N2", "--ntasks-per-node=1", sys.executable, TRAIN,
                              "--backend", "horovod", *ARGS], timeout=240).stdout
    _same_loss("horovod srun", _check(out), reference, rel_tol=1e-4)


def test_xla_trains_at_world_size_one(xla_python: str) -> None:
    """On XLA:CPU the run logs the seed's lines and its losses equal those of the same script
    on the CPU (torch 2.9 of .venv-xla), step by step."""
    xla = run([xla_python, TRAIN, "--backend", "xla-tpu", *ARGS], env={"PJRT_DEVICE": "CPU"},
              timeout=300).stdout
    cpu = run([xla_python, TRAIN, *ARGS], timeout=300).stdout
    xla_logs, cpu_logs = LOG.findall(xla), LOG.findall(cpu)
    assert [(r, w, n, m) for r, w, _e, n, m, _l in xla_logs] == [
        ("0", "1", n, "64") for n in ("0", "16", "32", "48")], xla
    assert [float(entry[5]) for entry in xla_logs] == pytest.approx(
        [float(entry[5]) for entry in cpu_logs], rel=1e-5)
    assert DIGEST.findall(xla) and DIGEST.findall(xla)[0][:2] == ("0", "1")


def test_two_xla_cpu_processes_fail_at_once(xla_python: str) -> None:
    proc = subprocess.run(
        [xla_python, TRAIN, "--backend", "xla-tpu", "--nproc_per_node", "2", *ARGS],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        env=launcher_free_environ({"PJRT_DEVICE": "CPU"}),
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("train.py: error: PJRT_DEVICE='CPU': asks for 2 XLA processes"), last
    assert "pytorch/xla/issues/9089" in last and "TPU" in last
    assert "Traceback" not in proc.stderr


#: 16 global steps of 16 samples per epoch at any world size
ELASTIC_ARGS = ["--seed", "7", "--nb_samples", "256", "--batch_size", "16", "--log_interval", "1"]
RANK0_STEP = re.compile(r"Process 0/(\d+) Train Epoch: 0 \[(\d+)/256\]\tLoss: (\S+)")


def _read_until(proc: subprocess.Popen[Any], text: str, timeout: float) -> str:
    """What ``proc`` wrote to stdout until ``text`` appeared (fails after ``timeout`` s)."""
    import select
    import time

    assert proc.stdout is not None
    fd, seen, deadline = proc.stdout.fileno(), b"", time.monotonic() + timeout
    while text.encode() not in seen:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(left, 0))
        chunk = os.read(fd, 65536) if ready else b""
        assert chunk, f"{text!r} not written within {timeout:g} s:\n{seen.decode()}"
        seen += chunk
    return seen.decode()


def _node(runner: Runner, addr: str, name: str, port: int, target: list[str],
          stdout: int | None = None) -> subprocess.Popen[Any]:
    """One node of a ``--nnodes 1:2`` job on a loopback alias (see tests/cli/test_elastic.py),
    its nodes beating every second."""
    return runner.start(
        ["--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
         "--rdzv-endpoint", f"127.0.1.2:{port}", "--max-restarts", "2", "--rdzv-conf",
         "join_timeout=60,last_call_timeout=5,keep_alive_interval=1,keep_alive_max_attempt=3",
         "--local-addr", addr, *target],
        stdout=stdout, env={"UNIRANK_NODE_NAME": name}, drop=("OMP_NUM_THREADS",))


def _unbroken(world: int) -> dict[int, float]:
    """Rank 0's loss at each global step of epoch 0 in an unbroken run at ``world``."""
    whole = run([sys.executable, TRAIN, "--nproc_per_node", str(world), *ELASTIC_ARGS]).stdout
    per_rank = 16 // world
    unbroken = {int(n) // per_rank: float(loss) for _w, n, loss in RANK0_STEP.findall(whole)}
    assert sorted(unbroken) == list(range(16)), whole
    return unbroken


def _saving_every_step(tmp_path: Path) -> list[str]:
    """train.py's command line for the elastic tests, a checkpoint saved after every step."""
    return [TRAIN, *ELASTIC_ARGS, "--checkpoint", str(tmp_path / "ckpt.pt"), "--save_every",
            "1"]


def test_a_lost_node_s_survivor_resumes_from_the_checkpoint_at_the_new_world(
        runner: Runner, tmp_path: Path) -> None:
    """Two nodes of 2 ranks train (``--save_every 1``); node B's ``unirank run`` is SIGKILLed
    once the world of 4 logged its second step: node A restarts alone and train.py resumes from its
    last checkpoint at world 2, saying why, mid-epoch (it did not start over), and each step
    from there has the loss of an unbroken run at world 2 (the global batch kept: no sample
    skipped or seen twice), to the same last loss."""
    unbroken, target = _unbroken(2), _saving_every_step(tmp_path)
    port = free_port()
    lost = _node(runner, "127.0.1.1", "nodeB", port, target, stdout=subprocess.PIPE)
    survivor = _node(runner, "127.0.1.2", "nodeA", port, target, stdout=subprocess.PIPE)
    # node B's rank 2 logs step 1 of the world of 4 once the checkpoint after step 0 is saved
    # (ur.save: every rank waits for rank 0's save)
    _read_until(lost, "Process 2/4 Train Epoch: 0 [4/256]", 120)
    lost.kill()
    lost.communicate(timeout=120)
    out_b, err_b = survivor.communicate(timeout=180)
    out, err = out_b.decode(), err_b.decode()
    assert survivor.returncode == 0, err
    resumed = re.findall(r"resumed from .* at epoch 0, batch (\d+) \(step (\d+)\)", out)
    assert resumed, out
    batch = int(resumed[-1][0])
    assert 0 < batch < 16, out  # mid-epoch: the steps before the checkpoint are kept
    assert re.search(r"new world size 4 -> 2 \(restart \d of 2, node lost: nodeB\): global "
                     r"batch 16 kept, 8 per rank", out), out
    after = [(int(n) // 8, float(loss)) for w, n, loss in RANK0_STEP.findall(out.split(
        "new world size 4 -> 2")[-1]) if w == "2"]
    assert [step for step, _ in after] == list(range(batch, 16)), out
    for step, loss in after:
        assert math.isclose(loss, unbroken[step], rel_tol=1e-4), (step, loss, unbroken[step])


def _workers_of(launcher: int) -> list[int]:
    """The worker processes below ``launcher`` (those whose argv runs train.py directly)."""
    found = []
    for pid in process_tree(launcher):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 1 and argv[1] == TRAIN.encode():
            found.append(pid)
    return found


def test_a_joining_node_resumes_the_run_from_its_step_at_the_larger_world(
        runner: Runner, tmp_path: Path) -> None:
    """Node A trains alone at world 2 (``--save_every 1``), its workers held (SIGSTOP) so
    that it cannot finish first; node B starts; once A's ``unirank run`` sees B waiting to
    join, the workers go on: they stop, and both nodes resume from the checkpoint at world 4,
    saying why, mid-epoch, each step with rank 0's loss of an unbroken run at world 4 (the
    global batch kept: the same weights, and rank 0 the same quarter of each batch)."""
    unbroken, target = _unbroken(4), _saving_every_step(tmp_path)
    port = free_port()
    first = _node(runner, "127.0.1.2", "nodeA", port, target, stdout=subprocess.PIPE)
    _read_until(first, "Process 0/2 Train Epoch: 0 [16/256]", 120)  # step 2 at world 2
    held = _workers_of(first.pid)
    assert len(held) == 2, held
    for pid in held:
        os.kill(pid, signal.SIGSTOP)
    try:
        second = _node(runner, "127.0.1.1", "nodeB", port, target, stdout=subprocess.PIPE)
        assert first.stderr is not None
        seen = read_lines(first.stderr, 1, contains="waiting to join", timeout=120)
    finally:
        for pid in held:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    (out_a, err_a), (out_b, err_b) = first.communicate(timeout=180), second.communicate(
        timeout=180)
    out, err = out_a.decode(), "\n".join(seen) + err_a.decode()
    assert (first.returncode, second.returncode) == (0, 0), err + err_b.decode()
    assert "(joined: nodeB)" in err, err
    assert re.search(r"new world size 2 -> 4 \(restart 0 of 2, node joined: nodeB\): global "
                     r"batch 16 kept, 4 per rank", out), out
    resumed = re.findall(r"resumed from .* at epoch 0, batch (\d+) \(step (\d+)\)", out)
    assert resumed, out
    batch = int(resumed[-1][0])
    assert 2 < batch < 16, out  # from the step A's workers were at, not from the start
    after = [(int(n) // 4, float(loss)) for w, n, loss in RANK0_STEP.findall(out.split(
        "new world size 2 -> 4")[-1]) if w == "4"]
    assert [step for step, _ in after] == list(range(batch, 16)), out
    for step, loss in after:
        assert math.isclose(loss, unbroken[step], rel_tol=1e-4), (step, loss, unbroken[step])
    assert "Process 2/4" in out_b.decode(), out_b.decode()
