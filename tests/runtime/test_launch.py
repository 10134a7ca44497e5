"""``ur.launch`` with a function defined in ``__main__`` (a script read from stdin, ``python
-c``, a script file with or without ``if __name__ == "__main__":``): real processes, real gloo
workers forked from the fork server.

Each script prints ``RESULT {json}`` lines; every wait has a timeout; nothing sleeps.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from _procs import launcher_free_environ

pytestmark = pytest.mark.integration

#: a model and a training function defined in __main__, two launches and a failing one
STDIN_SCRIPT = '''
import json, os, torch, unirank as ur

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.lin(x)

SCALE = 3.0

def train(local_rank, steps, lr=0.1):
    torch.manual_seed(0)
    model = ur.auto_model(Net())
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        loss = model(torch.ones(8, 4) * (ur.get_rank() + 1)).pow(2).mean()
        loss.backward()
        opt.step()
    print(f"trained {steps} steps")
    return {"rank": ur.get_rank(), "world": ur.get_world_size(), "pid": os.getpid(),
            "ppid": os.getppid(),
            "weight": model.module.lin.weight.detach().sum().item() * SCALE, "net": Net()}

def fail(local_rank):
    if local_rank == 1:
        raise ValueError("boom in rank 1")
    ur.barrier()

def report(**fields):
    print("RESULT " + json.dumps(fields), flush=True)

print("before the launch", flush=True)
first = ur.launch(train, 3, lr=0.05, nproc_per_node=2, backend="gloo")
report(kind="values", ranks=[v["rank"] for v in first], worlds=[v["world"] for v in first],
       weights=[v["weight"] for v in first], pids=[v["pid"] for v in first],
       ppids=[v["ppid"] for v in first],
       nets=[type(v["net"]).__name__ for v in first], parent=os.getpid())
try:
    ur.launch(fail, nproc_per_node=2, backend="gloo")
except ur.WorkerFailedError as exc:
    report(kind="failure", type=type(exc).__name__, rank=exc.rank, message=str(exc),
           cause=type(exc.__cause__).__name__, traceback=exc.traceback)
again = ur.launch(lambda r, k: (r * k, os.getppid()), 10, nproc_per_node=2, backend="gloo")
report(kind="again", values=[v for v, _ in again], ppids=[p for _, p in again])
os.environ["PYTHONUNIRANKTEST"] = "1"  # an interpreter variable the kept server lacks
renewed = ur.launch(lambda r: os.getppid(), nproc_per_node=2, backend="gloo")
report(kind="renewed", ppids=renewed)
'''


def run_python(args: list[str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], input=stdin, env=launcher_free_environ(),
                          capture_output=True, text=True, timeout=240)


def results(stdout: str) -> dict[str, dict[str, Any]]:
    found = [json.loads(line[len("RESULT "):]) for line in stdout.splitlines()
             if line.startswith("RESULT ")]
    return {r["kind"]: r for r in found}


def test_a_function_of_a_script_read_from_stdin_runs_on_two_ranks_and_returns_by_rank() -> None:
    proc = run_python(["-"], STDIN_SCRIPT)
    assert proc.returncode == 0, proc.stderr
    got = results(proc.stdout)
    values = got["values"]
    assert values["ranks"] == [0, 1] and values["worlds"] == [2, 2]
    # DDP averaged the gradients: both ranks hold the same weights
    assert values["weights"][0] == pytest.approx(values["weights"][1])
    # the workers are not forks of the caller: the fork server (a fresh interpreter) forked them
    assert values["parent"] not in values["pids"] + values["ppids"]
    # an object of a class defined in __main__ came back (by value)
    assert values["nets"] == ["Net", "Net"]
    lines = proc.stdout.splitlines()
    # whole lines, prefixed by rank, after what the caller printed before
    assert lines.index("before the launch") < lines.index("[rank0]:trained 3 steps")
    assert "[rank1]:trained 3 steps" in lines
    failure = got["failure"]
    assert failure["type"] == "WorkerFailedError" and failure["rank"] == 1
    assert "ValueError: boom in rank 1" in failure["message"]
    assert failure["cause"] == "RankTraceback"
    assert failure["traceback"].startswith("Traceback (most recent call last):")
    assert failure["traceback"].rstrip().endswith("ValueError: boom in rank 1")
    assert ", in fail" in failure["traceback"]
    # torch's "[rank1]: " before each traceback line and the tag: one prefix, not two
    assert "[rank1]: Traceback (most recent call last):" in proc.stderr
    assert "[rank1]:[rank1]:" not in proc.stderr and "[rank0]:[rank0]:" not in proc.stderr
    # a launch after a failed one works (a lambda: by value too), its workers forked from the
    # fork server the first launch started and kept
    assert got["again"]["values"] == [0, 10]
    assert got["again"]["ppids"] == values["ppids"] and len(set(values["ppids"])) == 1
    # a new fork server replaces the kept one when an interpreter variable changed
    renewed = got["renewed"]["ppids"]
    assert len(set(renewed)) == 1 and renewed != values["ppids"]
    assert values["parent"] not in renewed  # forked by the new server, not started by Popen


def test_python_c_without_cloudpickle_says_so_in_one_line() -> None:
    code = ("import sys; sys.modules['cloudpickle'] = None\n"
            "import unirank as ur\n"
            "def f(r): return r\n"
            "try:\n"
            "    ur.launch(f, nproc_per_node=2, backend='gloo')\n"
            "except ur.ConfigError as exc:\n"
            "    print('ERROR', exc)\n")
    proc = run_python(["-c", code])
    assert proc.returncode == 0, proc.stderr
    errors = [line for line in proc.stdout.splitlines() if line.startswith("ERROR ")]
    assert len(errors) == 1, proc.stdout
    assert "(f) is defined in a notebook cell or at the python prompt" in errors[0]
    assert "needs cloudpickle" in errors[0]
    assert "pip install 'unirank[notebook]'" in errors[0]


def test_a_return_value_that_cannot_be_pickled_is_one_line() -> None:
    code = ("import threading, unirank as ur\n"
            "def f(r): return threading.Lock()\n"
            "ur.launch(f, nproc_per_node=2, backend='gloo')\n")
    proc = run_python(["-c", code])
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("unirank.errors.ConfigError: the return value of f on local rank ")
    assert "cannot be pickled (TypeError: cannot pickle '_thread.lock' object)" in last
    assert "[rank0]:" not in proc.stderr  # no worker traceback: the one line says it all


def test_parallel_in_place_returns_this_processs_value(serial: object) -> None:
    import unirank as ur

    assert ur.Parallel().run(lambda local_rank, k: (local_rank, k), "x") == [(0, "x")]


#: a script without the guard: a top-level function and a lambda, launched at the top level
UNGUARDED = """
import sys
if "--no-cloudpickle" in sys.argv:
    sys.modules["cloudpickle"] = None
import json, unirank as ur

OFFSET = 10

def add(local_rank, x):
    return local_rank + x + OFFSET

print("top level", flush=True)
values = ur.launch(add, 5, nproc_per_node=2, backend="gloo")
doubled = ur.launch(lambda r: r * 2, nproc_per_node=2, backend="gloo")
print("RESULT " + json.dumps({"kind": "values", "add": values, "lambda": doubled}), flush=True)
"""


def test_a_script_s_top_level_functions_go_by_value_and_the_script_runs_once(
        tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    proc = run_python([str(script)])
    assert proc.returncode == 0, proc.stderr
    assert results(proc.stdout)["values"] == {"kind": "values", "add": [15, 16], "lambda": [0, 2]}
    # the workers did not run the script again (no launch from a launch)
    assert proc.stdout.splitlines().count("top level") == 1, proc.stdout
    assert "[rank0]:top level" not in proc.stdout and "[rank1]:" not in proc.stdout


def test_an_unguarded_launch_that_needs_main_by_name_is_refused_in_one_line(
        tmp_path: Path) -> None:
    """Without cloudpickle a script's function goes by name, so each worker imports the script
    as multiprocessing does; its top-level launch is then refused in one line (as
    multiprocessing refuses), not run again inside every worker."""
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    proc = run_python([str(script), "--no-cloudpickle"])
    assert proc.returncode == 1, proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("unirank.errors.ConfigError: ur.launch was called while a worker was "
                           "importing the script as __main__"), proc.stderr
    assert 'HINT: put the code that launches under if __name__ == "__main__":' in last
    assert "RESULT" not in proc.stdout and "[rank0]:[rank" not in proc.stdout
    # one traceback: the program's own (a rank still talking to the store as the job ends
    # may add torch's one-line warning before it, its stack dump folded: seen under load)
    assert "connectFullMesh" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    tracebacks = [i for i, line in enumerate(lines) if line.startswith("Traceback")]
    assert len(tracebacks) == 1 and str(script) in lines[tracebacks[0] + 1], proc.stderr


def test_a_guarded_script_without_cloudpickle_sends_its_function_by_name(tmp_path: Path) -> None:
    script = tmp_path / "guarded.py"
    script.write_text(UNGUARDED.replace("values = ur.launch", "def main():\n    values = ur.launch")
                      .replace("\ndoubled = ", "\n    doubled = ")
                      .replace('\nprint("RESULT', '\n    print("RESULT')
                      .replace("lambda r: r * 2,", "add, -10,")
                      + 'if __name__ == "__main__":\n    main()\n')
    proc = run_python([str(script), "--no-cloudpickle"])
    assert proc.returncode == 0, proc.stderr
    assert results(proc.stdout)["values"] == {"kind": "values", "add": [15, 16], "lambda": [0, 1]}
    # by name: each worker imported the script (its top level, not its guarded launch)
    assert "[rank0]:top level" in proc.stdout and "[rank1]:top level" in proc.stdout


def test_launch_options_by_name_and_fn_s_arguments_by_args_and_kwargs() -> None:
    """``hang_report_after=`` is launch's (the workers' detector gets it), not ``fn``'s; ``fn``
    may itself take a ``backend`` keyword, given through ``kwargs=``."""
    code = ("import json, unirank as ur\n"
            "from unirank.hang.watcher import running\n"
            "def f(r, x, backend=None, hang_report_after=None):\n"
            "    return [r, x, backend, hang_report_after, running().settings.report_after]\n"
            "values = ur.launch(f, args=(5,), kwargs={'backend': 'mine'}, nproc_per_node=2,\n"
            "                   backend='gloo', hang_report_after=30)\n"
            "print('RESULT ' + json.dumps({'kind': 'values', 'values': values}))\n")
    proc = run_python(["-c", code])
    assert proc.returncode == 0, proc.stderr
    values = results(proc.stdout)["values"]["values"]
    assert [v[:4] for v in values] == [[0, 5, "mine", None], [1, 5, "mine", None]]
    assert values[0][4] == 30.0 and values[1][4] == 30.0


def test_no_rank_leaves_init_before_every_rank_s_group_started() -> None:
    """torch's ``init_process_group`` has no barrier: a rank returning at once could end its
    group while a peer still connects (gloo's "Connection closed by peer" in about one of
    twenty launches of such a function here). ``ur.init`` returns only once every rank said
    its group started: each rank finds the other's mark in the store when its init returns."""
    code = ("import json, torch.distributed as dist, unirank as ur\n"
            "from unirank.runtime import state\n"
            "def f(r):\n"
            "    marks = dist.PrefixStore('started/join', state.STATE.stores[-1])\n"
            "    return marks.check([f'unirank/join/{1 - ur.get_rank()}'])\n"
            "print('RESULT ' + json.dumps({'kind': 'v', 'v': ur.launch(f, nproc_per_node=2,\n"
            "                                                          backend='gloo')}))\n")
    proc = run_python(["-c", code])
    assert proc.returncode == 0, proc.stderr
    assert results(proc.stdout)["v"]["v"] == [True, True]


def test_a_call_that_builds_ddp_gets_a_warm_fork_server(tmp_path: Path) -> None:
    """A function that names ``auto_model`` (in its pickled call, or in its module's file when
    it goes by name) has the fork server import DDP's first-step modules once, instead of each
    worker of every call (``WARM_PRELOAD``); other calls do not wait for them."""
    from torch.nn.parallel import DistributedDataParallel

    from unirank.runtime.parallel import _builds_ddp

    call = tmp_path / "call.pickle"
    call.write_bytes(b"...\x8c\nauto_model\x94...")
    assert _builds_ddp(str(call), len)
    plain = tmp_path / "plain.pickle"
    plain.write_bytes(b"...\x8c\nget_rank\x94...")
    assert not _builds_ddp(str(plain), len)
    assert _builds_ddp(str(plain), DistributedDataParallel.forward)  # by name: its file


def test_a_sigterm_to_the_caller_names_the_stop_and_the_ranks(tmp_path: Path) -> None:
    """SIGTERM to the process that called ``ur.launch``: forwarded to the workers; the script
    ends with 143 (as ``unirank run``) after one line naming the stop, and the workers with real
    ranks (not ``local rank -1 (rank -1) exited with code 143``), with no traceback."""
    import os
    import signal

    from _procs import read_stdout_until

    script = tmp_path / "term.py"
    script.write_text(
        "import time, unirank as ur\n"
        "def f(r):\n"
        "    print('READY', flush=True)\n"
        "    time.sleep(120)\n"
        "if __name__ == '__main__':\n"
        "    ur.launch(f, nproc_per_node=2, backend='gloo')\n")
    proc = subprocess.Popen([sys.executable, str(script)], env=launcher_free_environ(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    try:
        read_stdout_until(proc, lambda seen: seen.count(b"READY\n") >= 2, 240, "2 READY lines")
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    text = err.decode()
    assert proc.returncode == 143, (out, err)
    assert "stopped by SIGTERM (exit code 143)" in text, text
    assert "ranks 0-1" in text and "rank -1" not in text and "Traceback" not in text, text
