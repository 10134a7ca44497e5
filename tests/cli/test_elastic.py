"""``unirank run``'s dynamic rendezvous (torchrun's ``--rdzv-backend c10d`` without
``--node-rank``) and ``--nnodes MIN:MAX``, with real processes: each node is its own
``unirank run`` on a loopback alias (its own ``--local-addr``: 127.0.1.1, 127.0.1.2...), with
the same command otherwise, and its own UNIRANK_NODE_NAME so that the hello lines say which
node ran each rank.

The endpoint's node is 127.0.1.2, which torch's own order (by address) puts second: node rank
0 being that node shows unirank's order (the endpoint's host first).

Environment variables read: the caller's environment, from which launcher variables are removed
(see ``tests/_procs.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from _outputs import REPO, check_world, parse_hello

from _procs import Runner, free_port, process_tree, refusal_line

pytestmark = pytest.mark.integration

TIMEOUT = 120.0
ENDPOINT = "127.0.1.2"
OTHER = "127.0.1.1"
HELLO = str(REPO / "examples" / "helloworld.py")
NO_OMP = ("OMP_NUM_THREADS",)
#: a rendezvous that fails a broken test in a minute, not torch's ten
CONF = ["--rdzv-conf", "join_timeout=60"]

ENV_DUMP = """
import json, os, sys
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as fh:
    json.dump(dict(os.environ), fh)
"""


def _command(port: int, nodes: str = "2", nproc: int = 2, *extra: str,
             endpoint: str = ENDPOINT) -> list[str]:
    return ["--nnodes", nodes, "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{endpoint}:{port}", *extra]


def _node(runner: Runner, args: list[str], addr: str, name: str, target: list[str],
          stdout: int | None = None) -> subprocess.Popen[Any]:
    return runner.start([*args, "--local-addr", addr, *target], stdout=stdout, text=True,
                        env={"UNIRANK_NODE_NAME": name}, drop=NO_OMP)


def _ended(proc: subprocess.Popen[Any]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, out or "", err or ""


def test_the_same_command_on_two_nodes_gives_four_ranks_in_rank_order(
        runner: Runner, tmp_path: Path) -> None:
    args = _command(free_port(), "2", 2, *CONF)
    target = [HELLO, "--backend", "gloo"]
    # both nodes append to one file; each node's `unirank run` relays its workers' lines, so
    # lines of two nodes may land in either order (under load they did): rank order is
    # checked by rank, below, never by the order of the lines
    with open(tmp_path / "out.txt", "ab") as out:
        procs = [_node(runner, args, OTHER, "nodeB", target, stdout=out.fileno()),
                 _node(runner, args, ENDPOINT, "nodeA", target, stdout=out.fileno())]
        ended = [_ended(proc) for proc in procs]
    text = (tmp_path / "out.txt").read_text()
    context = text + "".join(err for _code, _out, err in ended)
    assert [code for code, _out, _err in ended] == [0, 0], context
    lines = parse_hello(text)
    check_world(lines, 4, addr=ENDPOINT, nodes=["nodeA", "nodeA", "nodeB", "nodeB"],
                context=context)


def _pair(runner: Runner, nodes: list[list[str]], folder: Path) -> dict[int, dict[str, str]]:
    """Every worker's environment, as the two nodes' commands ``nodes`` dump it to
    ``folder``."""
    folder.mkdir()
    procs = [runner.start(command=[*node, str(folder)], text=True, drop=NO_OMP)
             for node in nodes]
    ended = [_ended(proc) for proc in procs]
    assert [code for code, _out, _err in ended] == [0, 0], ended
    return {int(path.stem): json.loads(path.read_text()) for path in folder.glob("*.json")}


def test_workers_get_exactly_torchrun_s_variables(runner: Runner, tmp_path: Path) -> None:
    """torchrun and unirank run, the same options on two loopback nodes: every worker has the
    same variable names, and the same values but for the master's port and the error file's
    folder (both chosen at run time). The endpoint is the node torch's own order puts first
    (elsewhere unirank puts the endpoint's node first, torchrun does not)."""
    (tmp_path / "dump.py").write_text(ENV_DUMP)
    signals = ["--signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT"]  # torchrun's default

    def nodes(launcher: list[str]) -> list[list[str]]:
        port = free_port()
        return [[*launcher, *_command(port, "2", 2, "--rdzv-id", "job1", *signals,
                                      endpoint=OTHER),
                 "--local-addr", addr, "dump.py"] for addr in (ENDPOINT, OTHER)]

    torchrun = _pair(runner, nodes([sys.executable, "-m", "torch.distributed.run"]),
                     tmp_path / "torchrun")
    unirank = _pair(runner, nodes(Runner.command([])), tmp_path / "unirank")
    base = runner.environ(drop=NO_OMP)
    own = {"UNIRANK_INIT_TIMEOUT", "UNIRANK_NODE_NAME",  # unirank's, documented in run.md
           "UNIRANK_ATTEMPT_DIR", "UNIRANK_STATE_MEMORY"}
    assert sorted(torchrun) == sorted(unirank) == [0, 1, 2, 3]
    for rank in range(4):
        theirs = {k: v for k, v in torchrun[rank].items() if base.get(k) != v}
        ours = {k: v for k, v in unirank[rank].items() if base.get(k) != v and k not in own}
        assert sorted(ours) == sorted(theirs), rank
        changing = {"MASTER_PORT", "TORCHELASTIC_ERROR_FILE"}
        assert {k: v for k, v in ours.items() if k not in changing} == \
            {k: v for k, v in theirs.items() if k not in changing}, rank
        assert ours["TORCHELASTIC_ERROR_FILE"].endswith(f"/attempt_0/{rank % 2}/error.json")


def test_a_node_of_another_job_is_refused_and_the_job_runs(runner: Runner,
                                                          tmp_path: Path) -> None:
    port = free_port()
    target = [HELLO, "--backend", "gloo"]
    first = _node(runner, _command(port, "2", 1, *CONF, "--rdzv-id", "a"), ENDPOINT, "nodeA",
                  target)
    stranger = _node(runner, _command(port, "2", 1, *CONF, "--rdzv-id", "b"), "127.0.1.3",
                     "nodeC", target)
    code, _out, err = _ended(stranger)
    assert code == 2, err
    assert err.strip().splitlines() == [
        f"unirank run: error: --rdzv-id='b': is not the job the rendezvous at "
        f"{ENDPOINT}:{port} serves, 'a' HINT: give every node of one job the same --rdzv-id, "
        "and each job its own --rdzv-endpoint"]
    second = _node(runner, _command(port, "2", 1, *CONF, "--rdzv-id", "a"), OTHER, "nodeB",
                   target)
    ended = [_ended(first), _ended(second)]
    assert [c for c, _o, _e in ended] == [0, 0], ended
    check_world(parse_hello(ended[0][1] + ended[1][1]), 2, addr=ENDPOINT,
                nodes=["nodeA", "nodeB"])


def test_a_node_started_twice_is_refused_in_one_line(runner: Runner) -> None:
    """Two ``unirank run`` with the same --local-addr (started together: either may be the
    one refused) and the endpoint's node: one is refused, the two others run the job."""
    args = _command(free_port(), "2", 1, *CONF)
    target = [HELLO, "--backend", "gloo"]
    endpoint = _node(runner, args, ENDPOINT, "nodeA", target)
    twins = [_node(runner, args, OTHER, "nodeB", target) for _ in range(2)]
    ended = [_ended(proc) for proc in twins]
    refused = [e for e in ended if e[0] != 0]
    ran = [e for e in ended if e[0] == 0]
    assert len(refused) == len(ran) == 1, ended
    code, _out, err = refused[0]
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"unirank run: error: --local-addr='{OTHER}': this node already "
                               "takes part in the rendezvous 'none'")
    assert "HINT: a node joins a job once" in lines[0]
    code, out, err = _ended(endpoint)
    assert code == 0, err
    check_world(parse_hello(out + ran[0][1]), 2, addr=ENDPOINT, nodes=["nodeA", "nodeB"])


def test_an_elastic_range_starts_with_min_nodes_once_the_last_call_passed(
        runner: Runner) -> None:
    args = _command(free_port(), "1:2", 2, "--rdzv-conf", "join_timeout=60,last_call_timeout=1")
    code, out, err = _ended(_node(runner, args, ENDPOINT, "nodeA", [HELLO, "--backend", "gloo"]))
    assert code == 0, err
    lines = parse_hello(out)
    assert [line.rank for line in lines] == [0, 1], out + err
    check_world(lines, 2, addr=ENDPOINT, nodes=["nodeA", "nodeA"])


@pytest.mark.parametrize(("args", "expected"), [
    (["--nnodes", "1:2"], "--nnodes='1:2': is an elastic range, which needs the dynamic "
     "rendezvous"),
    (["--nnodes", "2", "--rdzv-backend", "c10d"], "--rdzv-endpoint=<unset>: is needed for the "
     "c10d rendezvous without --node-rank"),
    (["--nnodes", "2:1", "--rdzv-backend", "c10d"], "--nnodes='2:1': has MAX below MIN"),
    (["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-conf",
      "last_call_timeout=soon"], "--rdzv-conf last_call_timeout='soon': is not a number of "
     "seconds above 0"),
    (["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-conf",
      "join_timout=1"], "--rdzv-conf='join_timout=1': is not a rendezvous setting unirank knows"),
])
def test_bad_elastic_options_fail_at_once_with_one_line(runner: Runner, tmp_path: Path,
                                                       args: list[str], expected: str) -> None:
    (tmp_path / "never.py").write_text("raise SystemExit('must not run')\n")
    line = refusal_line(runner.run([*args, "never.py"], timeout=60, drop=NO_OMP))
    assert expected in line
    assert "HINT:" in line


# Steps of training: each rank all-reduces a one and says the world it sees; rank 2 (on the
# node that is killed) says through a FIFO that the world of 4 has run a step.
STEPS = """
import os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
import unirank as ur
state = ur.elastic_state()
if state.restarted and rank == 0:  # why this attempt runs, as unirank.elastic_state() says
    print(f"elastic state: {state.reason.kind}; lost {list(state.reason.lost_nodes)}; joined "
          f"{list(state.reason.joined_nodes)}; world {state.previous_world_size} -> "
          f"{state.world_size}", flush=True)
for step in range(int(sys.argv[1])):
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"step {step} rank {rank} world {world} sum {int(t.item())} restart {restart} "
          f"at {time.time():.3f}", flush=True)
    if step == 1 and rank == 2 and restart == "0":
        with open(sys.argv[2], "w") as fifo:
            fifo.write("ready")
    time.sleep(0.2)
dist.destroy_process_group()
"""


def _wait_fifo(path: Path, timeout: float) -> None:
    """Block until a writer wrote to the FIFO at ``path`` (at most ``timeout`` seconds)."""
    import select

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        assert ready, f"no worker wrote to {path} within {timeout:g} s"
    finally:
        os.close(fd)


def _one_to_two_nodes(tmp_path: Path) -> tuple[Path, list[str]]:
    """The training script and its FIFO in ``tmp_path``, and the options of a ``--nnodes 1:2``
    job with one restart and the default beats; the first round's last call gives node B time
    to join it even on one busy core (later rounds do not wait for it)."""
    (tmp_path / "steps.py").write_text(STEPS)
    fifo = tmp_path / "ready.fifo"
    os.mkfifo(fifo)
    return fifo, _command(free_port(), "1:2", 2, "--max-restarts", "1", "--rdzv-conf",
                          "join_timeout=60,last_call_timeout=10")


def test_a_lost_node_s_survivor_restarts_at_the_world_left(runner: Runner,
                                                          tmp_path: Path) -> None:
    """``--nnodes 1:2 --max-restarts 1``: node B's ``unirank run`` is SIGKILLed while the world
    of 4 trains; node A's workers fail, it re-rendezvouses once B's keep-alive lapsed, and
    restarts alone at a world of 2, which finishes."""
    fifo, args = _one_to_two_nodes(tmp_path)
    target = ["steps.py", "30", str(fifo)]
    lost = _node(runner, args, OTHER, "nodeB", target)
    survivor = _node(runner, args, ENDPOINT, "nodeA", target)
    _wait_fifo(fifo, TIMEOUT)
    lost.kill()
    lost.communicate(timeout=TIMEOUT)
    code, out, err = _ended(survivor)
    assert code == 0, err
    assert "unirank run: rendezvous round 1: node rank 0 of 1, 2 workers in all (left: nodeB)" \
        in err, err
    assert "unirank run: succeeded after 1 restart" in err, err
    restarted = [line for line in out.splitlines() if " restart 1 " in line]
    assert {line.split(" world ")[1].split()[0] for line in restarted} == {"2"}, out
    assert sum(" step 29 " in f" {line} " for line in restarted) == 2, out
    # the restarted script learns why (ur.elastic_state()): node B lost, world 4 -> 2
    assert "elastic state: node lost; lost ['nodeB']; joined []; world 4 -> 2" in out, out


def test_a_hung_node_is_noticed_within_seconds_and_left_behind(runner: Runner,
                                                              tmp_path: Path) -> None:
    """Node B's whole process tree is SIGSTOPped (a hung machine: no connection closes, so the
    collective alone would wait for its timeout): node A's rendezvous helper sees B's beat
    stall, A stops its workers, names B, and restarts alone at a world of 2."""
    fifo, args = _one_to_two_nodes(tmp_path)
    target = ["steps.py", "20", str(fifo)]
    hung = _node(runner, args, OTHER, "nodeB", target)
    survivor = _node(runner, args, ENDPOINT, "nodeA", target)
    _wait_fifo(fifo, TIMEOUT)
    frozen = process_tree(hung.pid)
    try:
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        code, out, err = _ended(survivor)
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert code == 0, err
    assert "unirank run: node nodeB (127.0.1.1) is lost: no beat for 3 s; stopping the " \
           "workers" in err, err
    assert "(left: nodeB)" in err, err
    assert "elastic state: node lost; lost ['nodeB']; joined []; world 4 -> 2" in out, out
    restarted = [line for line in out.splitlines() if " restart 1 " in line]
    assert {line.split(" world ")[1].split()[0] for line in restarted} == {"2"}, out
    assert sum(" step 19 " in f" {line} " for line in restarted) == 2, out


def test_a_node_joining_a_running_job_is_admitted_at_the_next_round(runner: Runner,
                                                                   tmp_path: Path) -> None:
    """``--nnodes 1:2``: node A runs alone (world 2) when node B starts; B waits to join, A's
    helper sees it, A stops its workers and both meet in the next round: world 4."""
    (tmp_path / "steps.py").write_text(STEPS.replace('rank == 2 and restart == "0"',
                                                     'rank == 0 and world == 2'))
    fifo = tmp_path / "ready.fifo"
    os.mkfifo(fifo)
    args = _command(free_port(), "1:2", 2, "--max-restarts", "1", "--rdzv-conf",
                    "join_timeout=60,last_call_timeout=2")
    target = ["steps.py", "20", str(fifo)]
    first = _node(runner, args, ENDPOINT, "nodeA", target)
    _wait_fifo(fifo, TIMEOUT)  # node A's world of 2 runs
    second = _node(runner, args, OTHER, "nodeB", target)
    (code_a, out_a, err_a), (code_b, out_b, err_b) = _ended(first), _ended(second)
    assert (code_a, code_b) == (0, 0), err_a + err_b
    assert "unirank run: 1 node waiting to join; stopping the workers" in err_a, err_a
    assert "node rank 0 of 2, 4 workers in all (joined: nodeB)" in err_a, err_a
    assert "elastic state: node joined; lost []; joined ['nodeB']; world 2 -> 4" in out_a, out_a
    # nodes joining spend no restart (torchrun's budget): the count stays 0 at world 4
    assert "restarting the workers for the nodes joining (no restart spent; 0 of 1 spent)" \
        in err_a, err_a
    assert {line.split(" restart ")[1].split()[0] for line in out_a.splitlines()
            if line.startswith("step ")} == {"0"}, out_a
    assert {line.split(" world ")[1].split()[0] for line in out_b.splitlines()
            if line.startswith("step ")} == {"4"}, out_b
    assert sum(" step 19 " in f" {line} " for line in out_a.splitlines() + out_b.splitlines()) \
        == 4, out_a + out_b


def test_the_same_command_twice_on_one_host_is_two_nodes(runner: Runner) -> None:
    """Nodes are agents, not hosts (as torchrun's): two ``unirank run`` with the very same
    command on one host, no ``--local-addr``, join as two nodes of one job."""
    args = _command(free_port(), "2", 1, *CONF, endpoint="127.0.0.1")
    target = [HELLO, "--backend", "gloo"]
    procs = [runner.start([*args, *target], text=True, drop=NO_OMP) for _ in range(2)]
    ended = [_ended(proc) for proc in procs]
    assert [code for code, _out, _err in ended] == [0, 0], ended
    lines = parse_hello(ended[0][1] + ended[1][1])
    assert sorted(line.rank for line in lines) == [0, 1], ended
    assert {line.world for line in lines} == {2}, ended
