"""The preloading fork server (:mod:`unirank.supervisor.fork.server`): its fork-safety check, the
fallback to workers started as their own interpreters (one line, ranks still succeed), and the
processes it makes: every forked worker is a child of the node's one server, restarts fork from
the same server, a SIGKILLed ``unirank run`` leaves nothing behind, and the server imports once
per node (``--timeline``).

The end-to-end tests run ``unirank run`` for real; the two CUDA tests use a stand-in
``torch.cuda.is_initialized`` (a mock: this machine has no GPU), as their docstrings say.

Environment variables read: the caller's environment, without launcher variables and without
UNIRANK_NO_PRELOAD (every test here needs the server on).
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import pytest

from _procs import Runner, assert_snippet_runs, wait_gone
from unirank.supervisor.fork.server import _preload, fork_hazard

TIMEOUT = 180.0
FALLBACK = "unirank run: starting workers as their own interpreters: "
SERVER_MARK = b"unirank.supervisor.fork.server"

# Each worker says who it is and who its parent (the server) and grandparent are.
_WHO = """
import json, os, sys
def _parent_of(pid):
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])
with open(f"/proc/{os.getppid()}/cmdline", "rb") as cmdline:
    _parent_cmd = cmdline.read().replace(b"\\0", b" ").decode()
print("WHO " + json.dumps({
    "rank": int(os.environ["RANK"]), "pid": os.getpid(), "ppid": os.getppid(),
    "grandparent": _parent_of(os.getppid()), "parent_cmd": _parent_cmd,
    "attempt": int(os.environ["TORCHELASTIC_RESTART_COUNT"])}), flush=True)
"""


#: the runs here use the fork server whatever the lane: its switch is dropped
_PRELOAD_SWITCH = ("UNIRANK_NO_PRELOAD",)


def _run(runner: Runner, args: Sequence[str],
         env: Optional[Mapping[str, str]] = None) -> tuple[int, subprocess.CompletedProcess[str]]:
    """Run ``unirank run ARGS`` to the end: its pid, and how it ended."""
    result = runner.run(args, env=env, drop=_PRELOAD_SWITCH, timeout=TIMEOUT)
    return result.pid, result


def _who(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(m) for m in re.findall(r"^WHO (.*)$", stdout, re.M)]


# -- fork_hazard ----------------------------------------------------------------------------------


def test_initialised_cuda_is_a_hazard(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in ``torch.cuda`` (a mock: no GPU here) whose ``is_initialized()`` is True.
    Without the CUDA check a server would fork children that cannot use the GPU."""
    monkeypatch.setitem(sys.modules, "torch.cuda",
                        types.SimpleNamespace(is_initialized=lambda: True))
    assert fork_hazard() == "CUDA was initialised while preloading"
    monkeypatch.setitem(sys.modules, "torch.cuda",
                        types.SimpleNamespace(is_initialized=lambda: False))
    assert fork_hazard() != "CUDA was initialised while preloading"


def test_a_running_thread_is_a_hazard() -> None:
    """Without the thread check a lock held by that thread could stay locked in the child."""
    started, stop = threading.Event(), threading.Event()

    def body() -> None:
        started.set()
        stop.wait(120)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    try:
        assert started.wait(60)
        others = len(os.listdir("/proc/self/task")) - 1
        assert others >= 1
        word = "thread" if others == 1 else "threads"
        assert fork_hazard() == f"{others} {word} besides the main one run after preloading"
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive()


def test_what_the_server_imports_starts_no_thread() -> None:
    """A fresh interpreter that imports what the server always preloads, with the server's own
    OPENBLAS_NUM_THREADS=1, has no hazard; then a thread is one."""
    assert_snippet_runs(
        "import os\n"
        "os.environ['OPENBLAS_NUM_THREADS'] = '1'\n"
        "import importlib, threading\n"
        "from unirank.supervisor.fork.client import DEFAULT_PRELOAD\n"
        "for name in DEFAULT_PRELOAD: importlib.import_module(name)\n"
        "from unirank.supervisor.fork.server import fork_hazard\n"
        "assert fork_hazard() is None, fork_hazard()\n"
        "stop = threading.Event()\n"
        "threading.Thread(target=stop.wait, args=(120,), daemon=True).start()\n"
        "assert fork_hazard() == '1 thread besides the main one run after preloading'\n"
        "stop.set()\n", timeout=120)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="OpenBLAS starts no thread on 1 CPU")
def test_openblas_loaded_with_its_default_threads_is_a_hazard() -> None:
    """Why the server imports with OPENBLAS_NUM_THREADS=1 (:data:`SERVER_ONLY`): without it
    numpy's OpenBLAS starts its thread pool at load and the server could not fork."""
    assert_snippet_runs(
        "import os\n"
        "os.environ.pop('OPENBLAS_NUM_THREADS', None)\n"
        "for name in ('GOTO_NUM_THREADS', 'OMP_NUM_THREADS'): os.environ.pop(name, None)\n"
        "import numpy\n"
        "from unirank.supervisor.fork.server import fork_hazard\n"
        "assert 'besides the main one' in str(fork_hazard()), fork_hazard()\n", timeout=120)


def test_a_module_that_cannot_be_imported_is_named() -> None:
    assert _preload(["unirank_no_such_module"]) == (
        "importing unirank_no_such_module failed: ModuleNotFoundError: "
        "No module named 'unirank_no_such_module'")


# -- the fallback, end to end ---------------------------------------------------------------------

_OK = "import os\nprint(f'ok {os.environ[\"RANK\"]}', flush=True)\n" + _WHO

_PRELOADS = {
    # a library that starts a (daemon) thread when it is imported
    "daemon_thread": ("import threading\n"
                      "threading.Thread(target=threading.Event().wait, daemon=True).start()\n",
                      "the fork server could not preload: 1 thread besides the main one run "
                      "after preloading"),
    # a non-daemon one, which the failed server does not wait for (it ends with os._exit)
    "plain_thread": ("import threading\n"
                     "threading.Thread(target=threading.Event().wait).start()\n",
                     "the fork server could not preload: 1 thread besides the main one run "
                     "after preloading"),
    # a stand-in (a mock: no GPU here) for a module that initialises CUDA at import
    "cuda_init": ("import torch.cuda\ntorch.cuda.is_initialized = lambda: True\n",
                  "the fork server could not preload: CUDA was initialised while preloading"),
}


@pytest.mark.integration
@pytest.mark.parametrize("module", sorted(_PRELOADS))
def test_a_hazardous_preload_falls_back_once(runner: Runner, tmp_path: Path, module: str) -> None:
    """Without the check the workers would be forked from a server that runs a thread (or has
    CUDA): the fallback line would be missing and the workers' parent would be the server."""
    code, reason = _PRELOADS[module]
    (tmp_path / f"{module}.py").write_text(code)
    (tmp_path / "ok.py").write_text(_OK)
    pid, result = _run(runner, ["-n", "2", "--preload", module, "ok.py"])
    assert result.returncode == 0, result.stderr
    assert sorted(re.findall(r"^ok \d$", result.stdout, re.M)) == ["ok 0", "ok 1"]
    assert result.stderr.count(FALLBACK) == 1, result.stderr
    assert f"{FALLBACK}{reason}\n" in result.stderr
    assert [w["ppid"] for w in _who(result.stdout)] == [pid, pid]  # own interpreters


@pytest.mark.integration
def test_a_thread_started_after_a_fork_makes_the_server_refuse(runner: Runner,
                                                               tmp_path: Path) -> None:
    """A preloaded library starts a thread in the server after its first fork (its
    ``os.register_at_fork`` hook): the next requests are refused, and those workers start as
    their own interpreters, with one line for all. Without the check at every fork they would
    be forked from a server running a thread."""
    (tmp_path / "late_thread.py").write_text(
        "import os, threading\n"
        "def start():\n"
        "    threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
        "os.register_at_fork(after_in_parent=start)\n")
    (tmp_path / "ok.py").write_text(_OK)
    pid, result = _run(runner, ["-n", "3", "--preload", "late_thread", "ok.py"])
    assert result.returncode == 0, result.stderr
    assert sorted(re.findall(r"^ok \d$", result.stdout, re.M)) == ["ok 0", "ok 1", "ok 2"]
    assert result.stderr.count(FALLBACK) == 1, result.stderr
    assert f"{FALLBACK}1 thread besides the main one run after preloading\n" in result.stderr
    parents = {w["rank"]: w["ppid"] for w in _who(result.stdout)}
    assert parents[0] != pid and parents[1] == parents[2] == pid, (parents, pid)


@pytest.mark.integration
def test_a_preload_that_fails_to_import_falls_back_once(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text(_OK)
    pid, result = _run(runner, ["-n", "2", "--preload", "no_such_module", "ok.py"])
    assert result.returncode == 0, result.stderr
    assert sorted(re.findall(r"^ok \d$", result.stdout, re.M)) == ["ok 0", "ok 1"]
    assert result.stderr.count(FALLBACK) == 1, result.stderr
    assert (f"{FALLBACK}the fork server could not preload: importing no_such_module failed: "
            f"ModuleNotFoundError: No module named 'no_such_module'\n") in result.stderr
    assert [w["ppid"] for w in _who(result.stdout)] == [pid, pid]


@pytest.mark.integration
def test_a_preload_module_is_imported_by_the_server(runner: Runner, tmp_path: Path) -> None:
    """``--preload MODULE``: the workers find it imported (by the server, before the fork)."""
    (tmp_path / "heavy.py").write_text("import os\nIMPORTED_BY = os.getpid()\n")
    (tmp_path / "check.py").write_text(
        _WHO + "import sys\nmod = sys.modules.get('heavy')\n"
        "print('IMPORTED_BY', mod and mod.IMPORTED_BY, flush=True)\n")
    pid, result = _run(runner, ["-n", "2", "--preload", "heavy", "check.py"])
    assert result.returncode == 0, result.stderr
    assert FALLBACK not in result.stderr
    server = {w["ppid"] for w in _who(result.stdout)}
    assert len(server) == 1 and pid not in server
    assert re.findall(r"^IMPORTED_BY (\S+)$", result.stdout, re.M) == [str(*server)] * 2


@pytest.mark.integration
def test_the_hang_watcher_each_worker_starts_is_imported_by_the_server(runner: Runner,
                                                                       tmp_path: Path) -> None:
    """Every worker starts a hang watcher (the default) before its script: the modules it takes
    are the server's imports, not each worker's after the fork (without it about 30 modules a
    worker)."""
    listing = ("import sys\nprint('HANG', sorted(m for m in sys.modules"
               " if m.startswith('unirank.hang')), flush=True)\n")
    server = subprocess.run(
        [sys.executable, "-c", "import importlib\n"
         "from unirank.supervisor.fork.client import DEFAULT_PRELOAD\n"
         "for name in DEFAULT_PRELOAD: importlib.import_module(name)\n" + listing],
        capture_output=True, text=True, timeout=TIMEOUT, check=True)
    preloaded = set(ast.literal_eval(server.stdout.split("HANG ", 1)[1]))
    assert "unirank.hang.watcher" in preloaded
    (tmp_path / "hang_modules.py").write_text(_WHO + listing)
    _, result = _run(runner, ["-n", "2", "hang_modules.py"])
    assert result.returncode == 0, result.stderr
    assert FALLBACK not in result.stderr
    seen = [set(ast.literal_eval(found))
            for found in re.findall(r"^HANG (.*)$", result.stdout, re.M)]
    assert len(seen) == 2 and all("unirank.hang.watcher" in s for s in seen), result.stdout
    assert all(s <= preloaded for s in seen), [sorted(s - preloaded) for s in seen]


# -- the processes --------------------------------------------------------------------------------


@pytest.mark.integration
def test_every_worker_is_a_child_of_the_one_server(runner: Runner, tmp_path: Path) -> None:
    """Without the server each worker's parent would be ``unirank run`` itself."""
    (tmp_path / "who.py").write_text(_WHO)
    pid, result = _run(runner, ["-n", "3", "who.py"])
    assert result.returncode == 0, result.stderr
    assert FALLBACK not in result.stderr
    who = _who(result.stdout)
    assert sorted(w["rank"] for w in who) == [0, 1, 2]
    assert len({w["ppid"] for w in who}) == 1
    assert who[0]["ppid"] != pid
    assert all(w["grandparent"] == pid for w in who)  # the server is the supervisor's child
    assert all(" unirank.supervisor.fork.server " in w["parent_cmd"] for w in who)


@pytest.mark.integration
def test_a_restart_forks_from_the_same_server(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "flaky.py").write_text(
        _WHO + "import torch.distributed as dist\n"
               "dist.init_process_group('gloo')\n"
               "dist.barrier()  # both said who they are before rank 1 fails\n"
               "if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0' and "
               "os.environ['RANK'] == '1':\n    sys.exit(5)\n")
    pid, result = _run(runner, ["-n", "2", "--max-restarts", "1", "flaky.py"])
    assert result.returncode == 0, result.stderr
    assert "attempt 0 failed (rank 1: exit code 5); restarting the workers" in result.stderr
    assert FALLBACK not in result.stderr
    who = _who(result.stdout)
    assert sorted((w["attempt"], w["rank"]) for w in who) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    parents = {w["ppid"] for w in who}
    assert len(parents) == 1 and pid not in parents
    assert len({w["pid"] for w in who}) == 4


_SLEEPER = _WHO + "import threading\nthreading.Event().wait(300)\n"


def _read_who(proc: subprocess.Popen[bytes], count: int) -> list[dict[str, Any]]:
    """Read stdout until ``count`` WHO lines came (bounded by TIMEOUT via the reader thread)."""
    assert proc.stdout is not None
    found: list[dict[str, Any]] = []
    done = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(b"WHO "):
                found.append(json.loads(line[4:]))
                if len(found) == count:
                    break
        done.set()

    threading.Thread(target=reader, daemon=True).start()
    assert done.wait(TIMEOUT), f"only {len(found)} of {count} workers said who they are"
    assert len(found) == count
    return found


@pytest.mark.integration
def test_sigkill_of_the_supervisor_leaves_no_server_and_no_worker(
        runner: Runner) -> None:
    """The server runs in its own session, which a SIGKILLed ``unirank run`` cannot signal:
    it ends on its parent-death signal or on its socket's end, and its workers die with it
    (their own parent-death signal). Without those, all three would outlive it."""
    runner.script("sleeper.py", _SLEEPER)
    proc = runner.start(["-n", "2", "sleeper.py"], drop=_PRELOAD_SWITCH)
    who = _read_who(proc, 2)
    server = {w["ppid"] for w in who}
    assert len(server) == 1 and proc.pid not in server
    workers = [w["pid"] for w in who]
    # all live before the kill (a worker's command line is a fresh interpreter's)
    assert wait_gone(server, timeout=0, mark=SERVER_MARK) == list(server)
    assert wait_gone(workers, timeout=0, mark=b"sleeper.py") == workers
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=TIMEOUT)
    assert wait_gone(server, timeout=60, mark=SERVER_MARK) == []
    assert wait_gone(workers, timeout=60, mark=b"sleeper.py") == []


@pytest.mark.integration
def test_the_server_imports_once_per_node(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "who.py").write_text(_WHO)
    raw = tmp_path / "times.json"
    _pid, result = _run(runner, ["-n", "2", "--timeline-json", str(raw), "who.py"])
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("fork server imported") == 1, result.stderr
    records = json.loads(raw.read_text())
    assert len(records) == 2
    # one import for the node: every rank carries the same times, before its own start
    assert len({(r["times"]["preload"], r["times"]["preloaded"]) for r in records}) == 1
    assert all(r["times"]["preloaded"] <= r["times"]["started"] for r in records)


@pytest.mark.integration
def test_one_server_per_node_on_two_nodes(slurm_testbed: Any) -> None:
    """``srun -N2 ... unirank run -n 2`` on the testbed's two nodes: the ranks of a node share
    its server's one import, the two nodes' servers are two, and the table has one row."""
    folder = slurm_testbed.work_dir
    (folder / "fs_who.py").write_text(_WHO)
    raw = folder / "fs_times.json"
    result = slurm_testbed.srun(
        Runner.command(["-n", "2", "--timeline-json", str(raw), str(folder / "fs_who.py")],
                       prefix=["-N2", "--ntasks-per-node=1"]),
        timeout=180, env={"UNIRANK_NO_PRELOAD": "0"})
    assert FALLBACK not in result.stderr
    assert result.stderr.count("fork server imported") == 1, result.stderr
    imports: dict[str, set[tuple[float, float]]] = {}
    for record in json.loads(raw.read_text()):
        times = record["times"]
        imports.setdefault(record["node"], set()).add((times["preload"], times["preloaded"]))
    assert sorted(imports) == ["node1", "node2"]
    assert all(len(pairs) == 1 for pairs in imports.values()), imports
    assert imports["node1"] != imports["node2"]
    who = _who(result.stdout)
    assert len(who) == 4 and len({w["ppid"] for w in who}) == 2
    # slurmctld may still list the step's job for a moment after srun returned (it then fails
    # the session's check for jobs left queued): wait for it, bounded
    deadline = time.monotonic() + 30
    while slurm_testbed.queued_test_jobs() and time.monotonic() < deadline:
        time.sleep(0.2)  # waiting on an external daemon: a bounded poll
