"""A worker's command line reads as a fresh interpreter's
(:mod:`unirank.supervisor.worker.cmdline`):
``pgrep -f SCRIPT`` finds every worker, ``/proc/PID/cmdline`` and ``sys.orig_argv`` are
``[sys.executable, SCRIPT, ARGS...]`` (or ``-m MODULE ARGS...``), ``/proc/PID/comm`` is a fresh
``python3``'s, and ``pkill -f`` ends the workers, reported as any killed worker. With workers
forked from the fork server and with ``--no-preload``; real ``unirank run``, ``pgrep`` and
``pkill``. Before, workers showed ``python3 -m unirank.supervisor.fork.server --control ...`` or
``python3 -m unirank.supervisor.worker.bootstrap SCRIPT ...``.

The fallback (the kernel refuses ``PR_SET_MM_MAP``) is checked in a fresh interpreter: the
arguments are written over the process's own range, NUL-filled, and cut to its length.

Environment variables read: the caller's environment without launcher variables (and without
UNIRANK_NO_PRELOAD, which each test sets itself).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from _procs import Runner, launcher_free_environ, read_stdout_until

pytestmark = pytest.mark.integration

TIMEOUT = 120.0
#: each worker says what it sees, then waits for a signal (the test's pkill)
_WORKER = """
import json, os, signal, sys
with open("/proc/self/comm") as comm:
    name = comm.read().strip()
print("SEEN", json.dumps({"pid": os.getpid(), "orig_argv": sys.orig_argv, "argv": sys.argv,
                          "comm": name}), flush=True)
signal.pause()
"""


def _fresh_comm() -> str:
    """What ``/proc/self/comm`` says in a fresh ``sys.executable SCRIPT``."""
    return subprocess.run([sys.executable, "-c", "print(open('/proc/self/comm').read().strip())"],
                          capture_output=True, text=True, timeout=TIMEOUT,
                          check=True).stdout.strip()


def _pgrep(pattern: str) -> set[int]:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True,
                           timeout=TIMEOUT)
    return {int(pid) for pid in found.stdout.split()}


@pytest.mark.skipif(shutil.which("pgrep") is None, reason="needs pgrep and pkill (procps)")
@pytest.mark.parametrize("module", [False, True], ids=["script", "module"])
@pytest.mark.parametrize("preload", [True, False], ids=["forked", "no-preload"])
def test_workers_read_as_fresh_interpreters(runner: Runner, tmp_path: Path, preload: bool,
                                            module: bool) -> None:
    name = f"train_{uuid.uuid4().hex[:12]}"
    (tmp_path / f"{name}.py").write_text(_WORKER)
    target = ["-m", name] if module else [f"{name}.py"]
    fresh = [sys.executable, *target, "--lr", "0.1"]
    proc = runner.start(["-n", "2", *target, "--lr", "0.1"],
                        env={} if preload else {"UNIRANK_NO_PRELOAD": "1"},
                        drop=("UNIRANK_NO_PRELOAD",))
    seen = read_stdout_until(proc, lambda out: out.count(b"SEEN ") == 2, TIMEOUT, "two workers")
    workers = [json.loads(m) for m in re.findall(rb"^SEEN (.*)$", seen, re.M)]
    pids = {w["pid"] for w in workers}
    comm = _fresh_comm()
    for worker in workers:
        assert worker["orig_argv"] == fresh, worker
        with open(f"/proc/{worker['pid']}/cmdline", "rb") as cmdline:
            assert cmdline.read() == b"\0".join(a.encode() for a in fresh) + b"\0"
        assert worker["comm"] == comm
    # `unirank run ... SCRIPT` names the script as well, as `torchrun SCRIPT` does
    assert _pgrep(name) == pids | {proc.pid}
    only_workers = re.escape(sys.executable) + " " + re.escape(" ".join(target))
    assert _pgrep(only_workers) == pids
    subprocess.run(["pkill", "-f", only_workers], timeout=TIMEOUT, check=True)
    _out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "killed by SIGTERM" in err.decode(), err


_FALLBACK = """
import sys
from unirank.supervisor.worker.cmdline import overwrite_in_place
ok = overwrite_in_place(sys.argv[1].encode() * 2 + b"\\0")
with open("/proc/self/cmdline", "rb") as cmdline:
    sys.stdout.buffer.write(cmdline.read())
"""


@pytest.mark.parametrize("repeat", [1, 400])
def test_in_place_fallback_fills_with_nul_and_cuts_to_its_range(repeat: int) -> None:
    """The process's range holds ``python -c CODE WORD``: a shorter line is NUL-filled to its
    length, a longer one cut to it with a NUL as its last byte."""
    word = "w" * repeat
    original = b"\0".join(a.encode() for a in (sys.executable, "-c", _FALLBACK, word)) + b"\0"
    shown = subprocess.run([sys.executable, "-c", _FALLBACK, word], capture_output=True,
                           timeout=TIMEOUT, check=True).stdout
    wanted = word.encode() * 2 + b"\0"
    assert len(shown) == len(original)
    if len(wanted) <= len(original):
        assert shown == wanted.ljust(len(original), b"\0")
    else:
        assert shown == wanted[:len(original) - 1] + b"\0"


_PARALLEL = """
import json, os, sys
import unirank as ur
def work(local_rank):
    with open("/proc/self/cmdline", "rb") as cmdline:
        shown = cmdline.read().decode()
    print("SEEN", json.dumps({"orig_argv": sys.orig_argv, "cmdline": shown}), flush=True)
    ur.barrier()  # no rank ends (and closes its gloo pairs) while another still connects
if __name__ == "__main__":
    print("PARENT", json.dumps(sys.orig_argv), flush=True)
    with ur.Parallel(backend="gloo", nproc_per_node=2) as parallel:
        parallel.run(work)
"""


@pytest.mark.parametrize("preload", [True, False], ids=["forked", "no-preload"])
def test_parallel_workers_show_their_program_s_command_line(tmp_path: Path,
                                                            preload: bool) -> None:
    """A ``Parallel`` worker runs a function of the program: it reads as that program, as a
    child of ``multiprocessing``'s fork would."""
    (tmp_path / "parallel_cmd.py").write_text(_PARALLEL)
    env = launcher_free_environ({} if preload else {"UNIRANK_NO_PRELOAD": "1"},
                                drop=("UNIRANK_NO_PRELOAD",))
    proc = subprocess.run([sys.executable, "parallel_cmd.py", "--lr", "0.1"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    parent = json.loads(proc.stdout.split("PARENT ", 1)[1].splitlines()[0])
    assert parent == [sys.executable, "parallel_cmd.py", "--lr", "0.1"]
    workers = [json.loads(m) for m in re.findall(r"^SEEN (.*)$", proc.stdout, re.M)]
    assert len(workers) == 2, proc.stdout
    for worker in workers:
        assert worker["orig_argv"] == parent
        assert worker["cmdline"] == "\0".join(parent) + "\0"
