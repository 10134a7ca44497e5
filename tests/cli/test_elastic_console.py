"""What the survivor of a lost node shows on its console (real ``unirank run`` nodes, two on one
host, as in ``test_elastic_recovery.py``): unirank's lines, not torch's. Workers that watch the
stop signals (``ur.stop_requested``, as ``examples/train.py``) end their step when unirank
stops them for the lost node: its collective fails on the dead peer (gloo's traceback) and
torch's TCPStore client warns with its C++ stack where the store's node is gone. Those lines
go to the attempt's ``folded.log`` (torch's C++ stacks always), and one line names it; a rank
that fails on its own first still shows its traceback.

Environment variables read: the caller's environment, from which launcher variables are removed
(see ``tests/_procs.py``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_elastic_recovery import TIMEOUT, Job, _kill_tree

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from _procs import Runner

pytestmark = pytest.mark.integration

# Steps of training that stop at unirank's SIGTERM after the step under way (every rank agrees
# on it with one all_reduce); FAIL_AT: this rank raises at that step, on its own. A step is
# mostly its sleep, and the survivor's ranks write the FIFO after the step's last collective,
# so that a node killed then reaches none of them in a collective (a
# worker that fails on its lost peer before unirank hears of the loss is a failure: its
# traceback stays on the console).
STOPPING = """
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
    if os.environ.get("FAIL_AT") == str(step) and restart == "0":
        raise ValueError(f"rank {rank} fails on its own at step {step}")
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"step {step} rank {rank} world {world} sum {int(t.item())} restart {restart}",
          flush=True)
    if ur.stop_requested():
        print(f"rank {rank} stopped at step {step}", flush=True)
        break
    if step == 1 and f"{rank},{world},{restart}" in when.split(":"):
        with open(fifo, "w") as out:
            out.write("ready")
    # the kill comes here: the news reaches unirank before the next step, even where it comes
    # by the beats (3 s), not the closed connection (a loaded machine)
    time.sleep(5.0 if world == 4 else 0.1)
dist.destroy_process_group()
"""

FOLDED = re.compile(r"^unirank run: \d+ lines? of the workers' output \(torch's C\+\+ stack "
                    r"dumps, what they printed once stopped\) are in ")
#: the line of a torch c10d warning (its C++ stack dump is folded, not the line)
C10D_WARNING = re.compile(r"^(\[rank\d+\]:)?\[W\d{4} [^]]*\] \[c10d\] ")


def _noise(lines: list[str]) -> list[str]:
    """The console lines that are not unirank's own (nor its summary's)."""
    return [line for line in lines
            if line.strip() and not line.startswith(("unirank run:", "  attempt ", "  rank "))]


@pytest.mark.parametrize("killed", ["store", "other"])
def test_the_survivor_shows_unirank_s_lines_and_folds_torch_s(runner: Runner, tmp_path: Path,
                                                            killed: str) -> None:
    """Two workers per node; the node serving the rendezvous (and rank 0's store) or the other
    is killed. The survivor's console holds unirank's lines only: the stopped workers' gloo
    tracebacks and torch's TCPStore stack dumps are in the attempt's ``folded.log``, which
    one line names (the run folder is kept for it), and the job goes on. The lines naming a
    node tell the two apart (same name, same address) by their pids."""
    # both of the survivor's ranks say their step 1 is done (out of every collective)
    ranks = (2, 3) if killed == "store" else (0, 1)
    # (loaded, node B may join at node A's second attempt: A's restart 1)
    job = Job(runner, tmp_path, 12, ":".join(f"{r},4,{k}" for r in ranks for k in (0, 1)),
              script=STOPPING, nproc=2)
    first, second = job.two_nodes()
    job.wait(2)
    dead, survivor = (first, second) if killed == "store" else (second, first)
    _kill_tree(dead)
    out, err = survivor.communicate(timeout=TIMEOUT)
    job.close()
    assert survivor.returncode == 0, err
    lines = err.splitlines()
    # the loss's stop (loaded, node B may have joined at a second round: a stop before)
    stops = [i for i, line in enumerate(lines) if "stopping the workers" in line
             and ("is lost" in line or "store moved" in line)]
    if not stops and killed == "other":
        # seen on one core only: the survivor's workers met the lost peer in their next step
        # before the news reached unirank; a worker that fails first is shown, as any failure
        assert "Connection closed by peer" in err and "attempt 0 failed" in err, err
        pytest.skip("the survivor's workers failed on their lost peer before the news came")
    assert stops, err
    stop = stops[0]
    # before the news, a worker may see the store's node gone: torch's warning's line alone
    assert [line for line in _noise(lines) if not C10D_WARNING.match(line)] == [], err
    assert _noise(lines[stop:]) == [], err  # after it, nothing of the workers'
    assert FOLDED.match(lines[stop + 1]), err  # said at the attempt's end
    folded = Path(lines[stop + 1].split(" are in ", 1)[1])
    assert folded.name == "folded.log" and folded.parent.name.startswith("attempt_"), err
    text = folded.read_text()
    assert "Traceback" in text or "frame #" in text, text
    assert any(line.startswith("step 11 rank 0 world 2 sum 2 restart ")
               for line in out.splitlines()), out
    # two nodes of one name on one address, told apart by their unirank run's pid: the store
    # moved to the survivor, or the other node is lost; the lost one left
    named = survivor if killed == "store" else dead
    assert f" (127.0.0.1, pid {named.pid})" in lines[stop], err
    gone = f" (127.0.0.1, pid {dead.pid})"
    assert any(line.startswith("unirank run: rendezvous round ") and "(left: " in line
               and f"{gone})" in line for line in lines), err


def test_a_rank_that_fails_on_its_own_shows_its_traceback(runner: Runner,
                                                          tmp_path: Path) -> None:
    """Rank 1 (node B) raises at step 2 on its own: its traceback is on node B's console (the
    failure is news, not noise); the job goes on."""
    job = Job(runner, tmp_path, 8, "1,2,0", script=STOPPING)
    first, second = job.two_nodes(env_b={"FAIL_AT": "2"})
    _out_b, err_b = second.communicate(timeout=TIMEOUT)
    _out_a, err_a = first.communicate(timeout=TIMEOUT)
    job.close()
    assert (first.returncode, second.returncode) == (0, 0), err_a + err_b
    assert "ValueError: rank 1 fails on its own at step 2" in err_b, err_b
    assert "Traceback (most recent call last)" in err_b, err_b
