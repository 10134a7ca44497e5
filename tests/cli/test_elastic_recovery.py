"""Recovery of ``unirank run``'s dynamic rendezvous with the settings a user starts with: the
same command twice on one host (two nodes, as torchrun's agents), no ``--local-addr``, no
``--rdzv-conf``. Real processes: node A starts first and serves the rendezvous, node B joins;
then a node's whole process tree is killed (a lost machine), and the survivor must go on.

Environment variables read: the caller's environment, from which launcher variables are removed
(see ``tests/_procs.py``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from _procs import Runner, free_port, process_tree, wait_listening
from unirank.exitcodes import EVICTED, HANG_TIMEOUT

pytestmark = pytest.mark.integration

TIMEOUT = 120.0
NO_OMP = ("OMP_NUM_THREADS",)

# Steps of training: each rank all-reduces a one and says the world it sees; the rank, world
# and restart given on the command line say through the FIFO that their step 1 ran (the test
# holds the FIFO open for reading from the start: a write never blocks).
STEPS = """
import os, sys, time
import torch
import torch.distributed as dist

steps, fifo, when = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
if restart != "0":
    import unirank as ur
    print(f"state {ur.elastic_state().describe()}", flush=True)
for step in range(steps):
    if os.environ.get("STUCK_AT") == str(step):
        time.sleep(1e9)  # alive, beating, never entering the next collective
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"step {step} rank {rank} world {world} sum {int(t.item())} restart {restart}",
          flush=True)
    if step == 1 and f"{rank},{world},{restart}" in when.split(":"):
        with open(fifo, "w") as out:
            out.write("ready")
    time.sleep(0.1)
dist.destroy_process_group()
"""


class Job:
    """One job of ``--nnodes 1:2 --nproc-per-node 1 --max-restarts 3`` (``nproc`` workers per
    node), its nodes started with the same command, running ``script`` (:data:`STEPS`)."""

    def __init__(self, runner: Runner, tmp_path: Path, steps: int, when: str,
                 *extra: str, script: str = STEPS, nproc: int = 1) -> None:
        (tmp_path / "steps.py").write_text(script)
        self.fifo = tmp_path / "ready.fifo"
        os.mkfifo(self.fifo)
        self.reader = os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK)
        self.keep = os.open(self.fifo, os.O_WRONLY)  # no EOF between two writers
        self.seen = 0
        self.readies = 0
        self.port = free_port()
        self.runner = runner
        self.args = [*extra, "--nnodes", "1:2", "--nproc-per-node", str(nproc),
                     "--max-restarts", "3",
                     "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.port}",
                     "steps.py", str(steps), str(self.fifo), when]

    def wait(self, count: int) -> None:
        """Until ``count`` steps of the command line's kind ran in all (at most
        :data:`TIMEOUT` seconds)."""
        import select

        while self.readies < count:
            ready, _, _ = select.select([self.reader], [], [], TIMEOUT)
            assert ready, f"no worker wrote to {self.fifo} within {TIMEOUT:g} s"
            self.readies += os.read(self.reader, 4096).count(b"ready")

    def close(self) -> None:
        os.close(self.reader)
        os.close(self.keep)

    def node(self, env: dict[str, str] | None = None) -> subprocess.Popen[Any]:
        return self.runner.start(self.args, text=True, drop=NO_OMP, env=env)

    def two_nodes(self, env_a: dict[str, str] | None = None,
                  env_b: dict[str, str] | None = None,
                  ) -> tuple[subprocess.Popen[Any], subprocess.Popen[Any]]:
        first = self.node(env_a)
        wait_listening(self.port, first, TIMEOUT)
        second = self.node(env_b)
        self.wait(1)  # the world of 2 ran a step
        return first, second


def _kill_tree(proc: subprocess.Popen[Any]) -> None:
    for pid in process_tree(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=TIMEOUT)


def _worlds(out: str, restart: int) -> set[str]:
    return {line.split(" world ")[1].split()[0] for line in out.splitlines()
            if line.startswith("step ") and line.endswith(f" restart {restart}")}


def test_the_endpoint_s_node_killed_the_other_goes_on_alone(runner: Runner,
                                                           tmp_path: Path) -> None:
    """Node A serves the rendezvous; its whole tree is killed: node B takes the rendezvous
    over (the successor rule), restarts at a world of 1 and finishes."""
    job = Job(runner, tmp_path, 30, "1,2,0")
    first, second = job.two_nodes()
    _kill_tree(first)
    out, err = second.communicate(timeout=TIMEOUT)
    job.close()
    assert second.returncode == 0, err
    assert "unirank run: store moved to node " in err, err
    assert "rendezvous round 1: node rank 0 of 1, 1 worker in all" in err, err
    assert "  attempt 0: store moved to node " in err, err  # the summary
    assert "state restart 1 of 3 (store moved to node " in out, out  # ur.elastic_state()
    assert _worlds(out, 1) == {"1"}, out
    assert "step 29 rank 0 world 1 sum 1 restart 1" in out.splitlines(), out


def test_a_killed_node_started_again_brings_the_world_back(runner: Runner,
                                                          tmp_path: Path) -> None:
    """Node B's whole tree is killed: A goes on at a world of 1 at once; B started again with
    the same command joins at the next round and the world is 2 again."""
    job = Job(runner, tmp_path, 150, "1,2,0:0,1,1")
    first, second = job.two_nodes()
    _kill_tree(second)
    job.wait(2)  # node A trains alone
    again = job.node()
    out_b, err_b = again.communicate(timeout=TIMEOUT)
    out_a, err_a = first.communicate(timeout=TIMEOUT)
    job.close()
    assert (first.returncode, again.returncode) == (0, 0), err_a + err_b
    # its workers may fail on their lost peer before the news: either way, B left
    assert "rendezvous round 1: node rank 0 of 1, 1 worker in all (left: " in err_a, err_a
    assert "1 node waiting to join" in err_a, err_a
    assert "state restart 1 of 3 (node lost: " in out_a, out_a
    assert "  attempt 0: node lost: " in err_a, err_a
    assert _worlds(out_a, 1) == {"1", "2"}, out_a  # B's rejoin spent no restart
    assert {line.split(" world ")[1].split()[0] for line in out_b.splitlines()
            if line.startswith("step ")} == {"2"}, out_b


@pytest.mark.parametrize("stuck", ["other", "store"])
def test_a_stuck_node_is_evicted_and_the_other_goes_on(runner: Runner, tmp_path: Path,
                                                      stuck: str) -> None:
    """A rank asleep in user code before step 5 (its node beats on): at ``--hang-timeout``
    the node of the rank that never entered the collective is evicted (``--on-hang``'s
    default in an elastic job with restarts left): its ``unirank run`` says one line, why it
    ends, the other restarts alone and finishes, its summary, ``ur.elastic_state()`` and
    ``--timeline`` saying the eviction; also when the stuck rank is rank 0 on the node that
    serves the rendezvous (the store moves)."""
    job = Job(runner, tmp_path, 30, "1,2,0", "--hang-timeout", "5", "--timeline")
    asleep = {"STUCK_AT": "5"}
    first, second = job.two_nodes(*((None, asleep) if stuck == "other" else (asleep, None)))
    evicted, survivor = (second, first) if stuck == "other" else (first, second)
    out, err = survivor.communicate(timeout=TIMEOUT)
    _out, err_evicted = evicted.communicate(timeout=TIMEOUT)
    job.close()
    rank = 1 if stuck == "other" else 0
    assert survivor.returncode == 0, err + err_evicted
    assert evicted.returncode == EVICTED, err_evicted  # its own code, not a refusal's 2
    # where rank 0's node is the evicted one, its hang reports are kept and named first
    said = [line for line in err_evicted.splitlines() if line.startswith("unirank run:")
            and not line.startswith(("unirank run: hang reports kept in ",
                                     "unirank run: an elastic job of 2 nodes "))]
    assert len(said) == 1, err_evicted  # no "restarting the workers" before it
    assert said[0].startswith(f"unirank run: error: node evicted: rank {rank} never entered "
                              "all_reduce #"), err_evicted
    assert said[0] == err_evicted.strip().splitlines()[-1], err_evicted
    assert "rendezvous round 1: node rank 0 of 1, 1 worker in all" in err, err
    # its restart's line says the eviction, not a failure of the rank that waited (86)
    assert f"unirank run: attempt 0 stopped (node evicted: rank {rank} never entered " \
        "all_reduce #" in err, err
    assert "attempt 0 failed" not in err, err
    # the survivor's summary says the eviction in the same words, whichever node hung
    assert f"  attempt 0: node evicted: rank {rank} never entered all_reduce #" in err, err
    assert f"state restart 1 of 3 (node evicted: rank {rank} never entered all_reduce #" \
        in out, out
    # --timeline: the recovery's phases, on the node where rank 0 now runs (the survivor)
    rows = err.split(f"unirank run: recovery before attempt 1 (node evicted: rank {rank} "
                     "never entered all_reduce #")
    assert len(rows) == 2, err
    assert [line.split()[0] for line in rows[1].splitlines()[2:7]] == [
        "news", "workers", "rendezvous", "workers", "first"], err
    assert "step 29 rank 0 world 1 sum 1 restart 1" in out.splitlines(), out


# Two ranks that call different collectives at the same step: no rank is stuck, every rank
# waits (the job's FIFO says that the world of 2 ran its first collective).
MISMATCHED = """
import os, sys
import torch
import torch.distributed as dist

steps, fifo, when = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"started rank {rank} restart {os.environ['TORCHELASTIC_RESTART_COUNT']}", flush=True)
t = torch.ones(4)
dist.all_reduce(t)
if rank == 0:
    with open(fifo, "w") as out:
        out.write("ready")
if rank == 1:
    dist.broadcast(t, 0)  # the mismatched call
else:
    dist.all_reduce(t)
"""


def test_a_mismatch_under_evict_says_nothing_to_evict_and_ends(runner: Runner,
                                                               tmp_path: Path) -> None:
    """Issue 40: ranks in different collectives at ``--hang-timeout`` under ``--on-hang
    evict`` (the elastic default): no rank is stuck, so no node can be evicted; each node says
    so in one line and ends with the hang timeout's exit code, never restarting into the same
    hang."""
    job = Job(runner, tmp_path, 1, "", "--hang-timeout", "4", script=MISMATCHED)
    first, second = job.two_nodes()
    out_a, err_a = first.communicate(timeout=TIMEOUT)
    out_b, err_b = second.communicate(timeout=TIMEOUT)
    job.close()
    line = ("unirank run: --on-hang evict: nothing to evict: no rank is stuck, every rank "
            "waits: rank 1 called another collective or shape than the others; the job ends")
    for out, err in ((out_a, err_a), (out_b, err_b)):
        assert err.splitlines().count(line) == 1, err_a + err_b
        assert "restarting the workers" not in err and "rendezvous round 1" not in err, err
        assert [row for row in out.splitlines() if row.startswith("started ")] in (
            ["started rank 0 restart 0"], ["started rank 1 restart 0"]), out
    assert (first.returncode, second.returncode) == (HANG_TIMEOUT, HANG_TIMEOUT), err_a + err_b


def test_the_endpoint_s_node_started_again_joins_the_running_job(runner: Runner,
                                                                tmp_path: Path) -> None:
    """Node A (the endpoint's) killed, node B serves the rendezvous (on the endpoint's port too:
    the same host); A started again with the original command finds the running job there
    and joins it (no second job): the world is 2 again, B's node first."""
    job = Job(runner, tmp_path, 150, "1,2,0:0,1,1")
    first, second = job.two_nodes()
    _kill_tree(first)
    job.wait(2)  # node B trains alone, the rendezvous moved to it
    again = job.node()
    out_a, err_a = again.communicate(timeout=TIMEOUT)
    out_b, err_b = second.communicate(timeout=TIMEOUT)
    job.close()
    assert (again.returncode, second.returncode) == (0, 0), err_a + err_b
    assert "unirank run: store moved to node " in err_b, err_b
    assert "1 node waiting to join" in err_b, err_b
    assert "node rank 0 of 2, 2 workers in all" in err_b, err_b
    assert {line.split(" world ")[1].split()[0] for line in out_a.splitlines()
            if line.startswith("step ")} == {"2"}, out_a
    assert _worlds(out_b, 1) == {"1", "2"}, out_b  # A's rejoin spent no restart


def test_a_node_waiting_to_join_follows_the_store_when_its_node_is_killed(
        runner: Runner, tmp_path: Path) -> None:
    """Nodes A (serving the rendezvous) and B run at MAX (2); node C, started with the same
    command, waits for the job's next round (it is in no round). A's whole tree is killed: B
    takes the rendezvous over, and C, told the last round at its hello, follows it to B by the
    same successor rule (never exit 2, never a job of its own): the next round is B and C, a
    world of 2, and both finish."""
    job = Job(runner, tmp_path, 60, "1,2,0")
    first, second = job.two_nodes()
    third = runner.start(job.args, drop=NO_OMP)
    assert third.stderr is not None
    runner.read_lines(third.stderr, 1, contains="this node waits to join: the job ",
                      timeout=TIMEOUT)
    _kill_tree(first)
    out_c, err_c = (s.decode() for s in third.communicate(timeout=TIMEOUT))
    out_b, err_b = second.communicate(timeout=TIMEOUT)
    job.close()
    assert (second.returncode, third.returncode) == (0, 0), err_b + err_c
    assert "unirank run: store moved to node " in err_b, err_b
    assert "unirank run: store moved to node " in err_c, err_c
    # C joins at B's first round or (where B closed it alone before C reached it) the next
    assert "node rank 0 of 2, 2 workers in all" in err_b, err_b
    assert out_b.splitlines()[-1].startswith("step 59 rank 0 world 2 sum 2 restart "), out_b
    steps_c = [line for line in out_c.splitlines() if line.startswith("step ")]
    assert steps_c and {line.split(" world ")[1].split()[0] for line in steps_c} == {"2"}, out_c
    assert steps_c[-1].startswith("step 59 rank 1 world 2 sum 2 restart "), out_c


def _torch_loaded_in(pids: list[int]) -> bool:
    """Whether one of ``pids`` has torch's library mapped (it imported torch)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            if "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text():
                return True
    return False


def test_a_spare_waits_warm_and_takes_a_killed_node_s_place_at_the_same_world_size(
        runner: Runner, tmp_path: Path) -> None:
    """Nodes A and B run at MAX (2); node C, the same command, waits to join (a spare): its
    fork server imports torch while it waits (before, it waited for C's first round, a
    second's import after a loss). B's whole tree is killed: C takes its place at once, the
    world stays 2, and the job ends with A and C."""
    import time

    job = Job(runner, tmp_path, 150, "1,2,0")
    first, second = job.two_nodes()
    spare = runner.start(job.args, drop=NO_OMP)
    assert spare.stderr is not None
    runner.read_lines(spare.stderr, 1, contains="this node waits to join: the job ",
                      timeout=TIMEOUT)
    deadline = time.monotonic() + TIMEOUT  # a bound for a failure, not a measure
    while not _torch_loaded_in(process_tree(spare.pid)):
        assert time.monotonic() < deadline, "the spare's fork server did not import torch"
        time.sleep(0.1)
    _kill_tree(second)
    out_c, err_c = (s.decode() for s in spare.communicate(timeout=TIMEOUT))
    out_a, err_a = first.communicate(timeout=TIMEOUT)
    job.close()
    assert (first.returncode, spare.returncode) == (0, 0), err_a + err_c
    assert "rendezvous round 1: node rank 0 of 2, 2 workers in all (left: " in err_a, err_a
    assert _worlds(out_a, 1) == {"2"}, out_a  # never a world of 1: the spare came at once
    steps_c = [line for line in out_c.splitlines() if line.startswith("step ")]
    assert steps_c[-1].startswith("step 149 rank 1 world 2 sum 2 restart "), out_c


def test_a_node_killed_and_started_again_three_times_spends_three_restarts(
        runner: Runner, tmp_path: Path) -> None:
    """``--max-restarts 3`` (torchrun's budget): node B's whole tree killed and B started
    again, three times in a row. Each loss spends one of node A's restarts (its workers' peer
    is gone, as torchrun's survivors fail in their collective), each rejoin none (a change of
    membership): the job goes on to its end at a world of 2, A's count 3 of 3."""
    job = Job(runner, tmp_path, 150, "1,2,0:0,1,1:0,1,2:0,1,3")
    first, second = job.two_nodes()  # B's first step at world 2: 1 ready
    for lost in (1, 2, 3):
        _kill_tree(second)
        job.wait(2 * lost)  # A alone at world 1, restart ``lost``
        second = job.node()
        if lost < 3:
            job.wait(2 * lost + 1)  # B back: its step at world 2
    _out_b, err_b = second.communicate(timeout=TIMEOUT)
    out_a, err_a = first.communicate(timeout=TIMEOUT)
    job.close()
    assert (first.returncode, second.returncode) == (0, 0), err_a + err_b
    for lost in (1, 2, 3):
        assert _worlds(out_a, lost) == {"1", "2"}, out_a  # alone, then with B back
    assert err_a.count("restarting the workers for the nodes joining (no restart spent") == 3, \
        err_a
    assert "state node joined: " in out_a and ", no restart spent (3 of 3 spent)" in out_a, \
        out_a  # ur.elastic_state() after the last rejoin
    assert "step 149 rank 0 world 2 sum 2 restart 3" in out_a.splitlines(), out_a


# Steps of a program that handles stop requests (the pattern the docs recommend): the SIGTERM
# of a change of the world only sets its flag, acted on at a step's end.
STOPPABLE = """
import os, sys, time
import torch
import torch.distributed as dist
import unirank as ur

steps, fifo, when = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo")
ur.watch_stop_signals()
rank, world = dist.get_rank(), dist.get_world_size()
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
for step in range(steps):
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"step {step} rank {rank} world {world} sum {int(t.item())} restart {restart}",
          flush=True)
    if step == 1 and f"{rank},{world},{restart}" in when.split(":"):
        with open(fifo, "w") as out:
            out.write("ready")
    if ur.stop_requested():
        print(f"rank {rank} stopped at step {step}", flush=True)
        sys.exit(0)
    time.sleep(0.1)
dist.destroy_process_group()
"""


def test_a_frozen_node_s_peer_waiting_in_a_collective_is_ended_at_once(
        runner: Runner, tmp_path: Path) -> None:
    """Node B's whole tree frozen (SIGSTOP): node A's worker waits in an all_reduce with it;
    its program handles stop requests, so the SIGTERM of the lost node only sets a flag.
    The worker is ended by the short wait's SIGKILL (the line says so), not after the grace
    period, and A trains on alone."""
    job = Job(runner, tmp_path, 150, "1,2,0:0,1,1", script=STOPPABLE)
    first, second = job.two_nodes()
    frozen = process_tree(second.pid)
    for pid in frozen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    try:
        job.wait(2)  # A alone at world 1, restart 1
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        second.communicate(timeout=TIMEOUT)
    out_a, err_a = first.communicate(timeout=TIMEOUT)
    job.close()
    assert first.returncode == 0, err_a
    said = [line for line in err_a.splitlines() if "waits in a collective with a node that is "
            "gone: SIGKILL now, not after the grace period" in line]
    assert len(said) == 1 and said[0].startswith("unirank run: rank "), err_a
    assert "(at 2 s for those waiting in a collective)" in err_a, err_a
    assert _worlds(out_a, 1) == {"1"}, out_a
    assert "step 149 rank 0 world 1 sum 1 restart 1" in out_a.splitlines(), out_a
