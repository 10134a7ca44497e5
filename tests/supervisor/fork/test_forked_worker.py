"""A worker forked from the fork server behaves as a fresh interpreter, for real (``unirank run``
with real workers): what its libraries fixed at import is its own (thread counts, random
state), BLAS and DataLoader workers run in it, its script or module sees what ``python`` gives
it, and it ends as an interpreter does (exit code, traceback, signal, atexit, open files, C's
stdio, non-daemon threads, unbuffered output).

Each test also checks which path started the workers: forked from the server (each worker's
parent is not ``unirank run``, no fallback line), or, in the no-preload lane
(``UNIRANK_NO_PRELOAD=1``, tests/supervisor/test_no_preload_lane.py), as their own interpreters
(the parent is ``unirank run``), so that both paths are held to the same behaviour.

Environment variables read: the caller's environment without launcher variables;
UNIRANK_NO_PRELOAD (kept, see above); PYTHONUNBUFFERED and OMP_NUM_THREADS are set or dropped
per test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import pytest

from _procs import Runner, launcher_free_environ

pytestmark = pytest.mark.integration

TIMEOUT = 180.0
FALLBACK = "unirank run: starting workers as their own interpreters"
#: whether ``unirank run`` forks its workers (the no-preload lane turns it off)
FORKED = os.environ.get("UNIRANK_NO_PRELOAD", "").strip() in ("", "0")

_PARENT = "import os as _os\nprint('PARENT', _os.getppid(), flush=True)\n"


def _run(runner: Runner, args: Sequence[str], env: Optional[Mapping[str, str]] = None,
         drop: Sequence[str] = (), stdout: Optional[int] = None,
         ) -> subprocess.CompletedProcess[str]:
    """Run ``unirank run ARGS`` to the end and check which path started its workers (see the
    module docstring)."""
    result = runner.run(args, env=env, drop=drop, stdout=stdout, timeout=TIMEOUT)
    pid, out, err = result.pid, result.stdout, result.stderr
    parents = [int(p) for p in re.findall(r"^PARENT (\d+)$", out or "", re.M)]
    parents += [int(p) for p in re.findall(r"^PARENT (\d+)$", err, re.M)]
    assert parents, f"no worker said who its parent is:\n{out}\n{err}"
    if FORKED:
        assert FALLBACK not in err, err
        assert len(set(parents)) == 1 and pid not in parents, (parents, pid)
    else:
        assert set(parents) == {pid}, (parents, pid)
    return result


def _fresh(code: str, environ: Mapping[str, str], cwd: Path) -> Any:
    """What ``python -c CODE`` prints (one JSON value), started with ``environ``."""
    proc = subprocess.run([sys.executable, "-c", code], env=dict(environ), cwd=cwd,
                          capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _tagged(stdout: str, tag: str) -> list[dict[str, Any]]:
    found = [json.loads(m) for m in re.findall(rf"^{tag} (.*)$", stdout, re.M)]
    return sorted(found, key=lambda value: int(value.get("rank", 0)))


# -- values fixed at import -----------------------------------------------------------------------

_COUNTS = """
import json, torch
from unirank.supervisor.fork.importtime import blas_threads
print(json.dumps({"threads": torch.get_num_threads(), "interop": torch.get_num_interop_threads(),
                  "blas": blas_threads()}))
"""

_VALUES = _PARENT + """
import json, os, random
import numpy, torch
from unirank.supervisor.fork.importtime import blas_threads
print("VALUES " + json.dumps({
    "rank": int(os.environ["RANK"]), "threads": torch.get_num_threads(),
    "interop": torch.get_num_interop_threads(), "blas": blas_threads(),
    "numpy": numpy.random.rand(), "random": random.random(), "environ": dict(os.environ)}),
    flush=True)
"""


@pytest.mark.parametrize("omp", [None, "2"], ids=["omp-unset", "omp-2"])
def test_import_time_values_are_the_worker_s_own(runner: Runner,
                                                 tmp_path: Path, omp: Optional[str]) -> None:
    """Thread counts equal a fresh interpreter's with the worker's environment, and each rank
    draws its own random numbers. Without the server importing with the workers' common
    environment torch's count would be the supervisor's (OMP_NUM_THREADS unset); without
    :func:`~unirank.supervisor.fork.importtime.apply_worker_values` OpenBLAS would keep the
    server's one thread (OMP_NUM_THREADS=2) and numpy's numbers would be the same in every
    rank (torch does not import ``numpy.random``: ``--preload numpy.random`` makes the server
    import it, with OMP_NUM_THREADS=2)."""
    (tmp_path / "values.py").write_text(_VALUES)
    env = {} if omp is None else {"OMP_NUM_THREADS": omp}
    preload = [] if omp is None else ["--preload", "numpy.random"]
    result = _run(runner, ["-n", "2", *preload, "values.py"], env=env,
                  drop=("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS"))
    assert result.returncode == 0, result.stderr
    values = _tagged(result.stdout, "VALUES")
    assert [v["rank"] for v in values] == [0, 1]
    for value in values:
        environ = value["environ"]
        assert environ["OMP_NUM_THREADS"] == (omp or "1")  # the contract's 1 for -n 2
        assert "OPENBLAS_NUM_THREADS" not in environ  # the server's own value stays its own
        assert value["blas"], "numpy's OpenBLAS is not loaded"
        fresh = _fresh(_COUNTS, environ, tmp_path)
        assert {k: value[k] for k in ("threads", "interop", "blas")} == fresh
    assert values[0]["numpy"] != values[1]["numpy"]
    assert values[0]["random"] != values[1]["random"]


_COMPUTE = _PARENT + """
import os, numpy, torch
from torch.utils.data import DataLoader, Dataset
from unirank.supervisor.fork.importtime import blas_threads

class Squares(Dataset):
    def __len__(self):
        return 40
    def __getitem__(self, i):
        return torch.tensor([i * i, os.getpid()])

a = numpy.arange(300 * 300, dtype=numpy.float64).reshape(300, 300) % 7
assert numpy.allclose(a @ numpy.eye(300) @ a, (a @ a).T.T)
ones = numpy.ones((300, 300))
print("NUMPY", int((ones @ ones)[0, 0]), blas_threads(), flush=True)
t = torch.ones(300, 300)
print("TORCH", int((t @ t)[0, 0]), flush=True)
batches = list(DataLoader(Squares(), batch_size=4, num_workers=2))
print("LOADER", sum(int(b[:, 0].sum()) for b in batches),
      len({int(p) for b in batches for p in b[:, 1]} - {os.getpid()}), flush=True)
"""


def test_blas_and_a_dataloader_work_in_the_worker(runner: Runner, tmp_path: Path) -> None:
    """numpy's OpenBLAS (set to 2 threads in the worker, after the server loaded it with
    one) and a DataLoader whose 2 workers fork from the forked worker compute right. Were
    OpenBLAS loaded with its default threads the server would refuse to fork (fallback line)."""
    (tmp_path / "compute.py").write_text(_COMPUTE)
    result = _run(runner, ["-n", "1", "compute.py"], env={"OMP_NUM_THREADS": "2"},
                  drop=("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS"))
    assert result.returncode == 0, result.stderr
    cpus = len(os.sched_getaffinity(0))
    assert f"NUMPY 300 [{min(2, cpus)}]\n" in result.stdout
    assert "TORCH 300\n" in result.stdout
    # sum of i*i for i < 40, computed by two processes other than the worker
    assert "LOADER 20540 2\n" in result.stdout


_SPAWN = """
import multiprocessing, os, sys

def square(x):
    return x * x

if __name__ == "__main__":
    print("PARENT", os.getppid(), flush=True)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        print("SPAWNED", sum(pool.map(square, range(10))), flush=True)
"""


def test_multiprocessing_spawn_works_in_the_worker(runner: Runner, tmp_path: Path) -> None:
    """A spawned child re-imports the worker's ``__main__`` from what the worker's ``sys``
    says (its ``__main__`` module, ``sys.path``, ``sys.argv``): in a forked worker these must
    be the program's, not the fork server's."""
    (tmp_path / "spawner.py").write_text(_SPAWN)
    result = _run(runner, ["-n", "1", "spawner.py"])
    assert result.returncode == 0, result.stderr
    assert "SPAWNED 285\n" in result.stdout


# -- the program sees what python gives it --------------------------------------------------------

_WHAT = """
import json, os, sys
print("WHAT " + json.dumps({
    "argv": sys.argv, "file": os.path.abspath(__file__), "path0": sys.path[0],
    "name": __name__, "spec": __spec__ and __spec__.name,
    "main_is_me": sys.modules["__main__"].__dict__ is globals()}), flush=True)
"""


def _plain_what(args: Sequence[str], cwd: Path) -> Any:
    """The WHAT record of ``python ARGS``, run plainly in ``cwd``."""
    plain = subprocess.run([sys.executable, *args], cwd=cwd, timeout=TIMEOUT,
                           capture_output=True, text=True, env=launcher_free_environ())
    assert plain.returncode == 0, plain.stderr
    return _tagged(plain.stdout, "WHAT")[0]


def test_a_script_sees_what_python_gives_it(runner: Runner, tmp_path: Path) -> None:
    script = tmp_path / "what.py"
    script.write_text(_PARENT + _WHAT)
    result = _run(runner, ["-n", "1", "what.py", "a", "--b"])
    assert result.returncode == 0, result.stderr
    (ours,) = _tagged(result.stdout, "WHAT")
    assert ours == _plain_what(["what.py", "a", "--b"], tmp_path)
    assert ours["argv"] == ["what.py", "a", "--b"] and ours["file"] == str(script)
    assert ours["path0"] == str(tmp_path) and ours["name"] == "__main__"


def test_a_module_sees_what_python_m_gives_it(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text(_PARENT + _WHAT)
    result = _run(runner, ["-n", "1", "-m", "pkg.mod", "x"])
    assert result.returncode == 0, result.stderr
    (ours,) = _tagged(result.stdout, "WHAT")
    assert ours == _plain_what(["-m", "pkg.mod", "x"], tmp_path)
    assert ours["argv"] == [str(tmp_path / "pkg" / "mod.py"), "x"]
    assert ours["name"] == "__main__" and ours["spec"] == "pkg.mod"


# -- how it ends ----------------------------------------------------------------------------------


def test_sys_exit_code_is_the_run_s(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "exit3.py").write_text(_PARENT + "import sys\nsys.exit(3)\n")
    result = _run(runner, ["-n", "1", "exit3.py"])
    assert result.returncode == 3, result.stderr
    summary = result.stderr[result.stderr.index("unirank run: FAILED"):]
    assert "rank 0 (local rank 0)" in summary and "exit code 3" in summary


@pytest.mark.parametrize("code", ["256", "-1", "'text'", "None", "True", "2 ** 70"])
def test_system_exit_ends_the_worker_as_python_ends(runner: Runner, tmp_path: Path,
                                                     code: str) -> None:
    """``raise SystemExit(CODE)``: the run's exit status and the error file's exit code are
    those of ``python script.py`` (256 -> 0, -1 -> 255, 2 ** 70 -> 255, a text printed and
    1); a clean exit leaves no error file."""
    script = tmp_path / "leave.py"
    script.write_text(_PARENT + f"raise SystemExit({code})\n")
    python = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    logs = tmp_path / "logs"
    result = _run(runner, ["-n", "1", "--log-dir", str(logs), "--rdzv-id", "leave",
                           "leave.py"])
    assert result.returncode == python.returncode, result.stderr
    [folder] = logs.glob("leave_*/attempt_0/0")
    error_file = folder / "error.json"
    if python.returncode == 0:
        assert not error_file.exists(), error_file.read_text()
    else:
        record = json.loads(error_file.read_text())
        assert record["unirank_exit_code"] == python.returncode, record
    if code == "'text'":
        assert "text\n" in python.stderr
        assert "text\n" in result.stderr[:result.stderr.index("unirank run: FAILED")]


def test_an_uncaught_exception_prints_the_program_s_traceback(runner: Runner,
                                                              tmp_path: Path) -> None:
    """The traceback has the program's frames only (a forked worker starts in unirank's
    forkserver.py and forked.py), and the error file records the exception."""
    (tmp_path / "crash.py").write_text(
        _PARENT + "def explode():\n    raise ValueError('boom in the worker')\nexplode()\n")
    logs = tmp_path / "logs"
    result = _run(runner, ["-n", "1", "--log-dir", str(logs), "--rdzv-id", "crashrun",
                             "crash.py"])
    assert result.returncode == 1, result.stderr
    trace = result.stderr[result.stderr.index("Traceback (most recent call last):"):]
    trace = trace[:trace.index("ValueError: boom in the worker")]
    assert [os.path.basename(f) for f in re.findall(r'File "([^"]+)"', trace)] == [
        "crash.py", "crash.py"], trace
    for hidden in ("forked.py", "forkserver.py", "bootstrap.py", "runpy", "target.py"):
        assert hidden not in result.stderr, result.stderr
    [error_file] = logs.glob("crashrun_*/attempt_0/0/error.json")
    record = json.loads(error_file.read_text())
    assert "boom in the worker" in json.dumps(record)
    assert "exit code 1" in result.stderr[result.stderr.index("unirank run: FAILED"):]


def test_a_worker_killed_by_sigsegv_is_named(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "segv.py").write_text(
        _PARENT + "import os, resource, signal\n"
        "resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file\n"
        "os.kill(os.getpid(), signal.SIGSEGV)\n")
    result = _run(runner, ["-n", "1", "segv.py"])
    assert result.returncode == 128 + 11, result.stderr
    summary = result.stderr[result.stderr.index("unirank run: FAILED"):]
    assert "killed by SIGSEGV (signal 11)" in summary


_ENDING = _PARENT + """
import atexit, ctypes, threading
atexit.register(print, "atexit ran", flush=True)
ctypes.CDLL(None).printf(b"from C stdio\\n")
main = threading.main_thread()

def after_main():
    main.join(120)  # returns once the main thread has ended
    with open("thread.txt", "w") as out:
        out.write(f"main ended first: {not main.is_alive()}")

threading.Thread(target=after_main).start()
"""


def test_the_worker_ends_as_an_interpreter_does(runner: Runner, tmp_path: Path) -> None:
    """A forked worker ends with ``os._exit``: without running the atexit handlers, flushing
    C's stdio and joining non-daemon threads first, each of these would be lost (C's stdout
    is buffered on a pipe without PYTHONUNBUFFERED)."""
    (tmp_path / "ending.py").write_text(_ENDING)
    result = _run(runner, ["-n", "1", "ending.py"], drop=("PYTHONUNBUFFERED",))
    assert result.returncode == 0, result.stderr
    assert "atexit ran\n" in result.stdout
    assert "from C stdio\n" in result.stdout
    assert (tmp_path / "thread.txt").read_text() == "main ended first: True"


_LEFT_OPEN = _PARENT + """
kept = open("left-open.txt", "w")
kept.write("buffered, never closed")

def a_function_so_that_the_globals_are_a_cycle():
    return kept
"""


def test_a_file_left_open_is_flushed(runner: Runner, tmp_path: Path) -> None:
    """As ``python script.py`` does (its ``__main__`` is cleared at exit). A forked worker ends
    with ``os._exit``: without flushing every open file first, the data would be lost."""
    (tmp_path / "left_open.py").write_text(_LEFT_OPEN)
    result = _run(runner, ["-n", "1", "left_open.py"])
    assert result.returncode == 0, result.stderr
    plain = tmp_path / "plain"
    plain.mkdir()
    subprocess.run([sys.executable, str(tmp_path / "left_open.py")], cwd=plain, timeout=TIMEOUT,
                   env=launcher_free_environ(), check=True, capture_output=True)
    assert (plain / "left-open.txt").read_text() == "buffered, never closed"
    assert (tmp_path / "left-open.txt").read_text() == "buffered, never closed"


_STDIO = """
import json, os, sys
info = {name: [getattr(sys, name).write_through, getattr(sys, name).line_buffering]
        for name in ("stdout", "stderr")}
"""
_STDIO_WORKER = _PARENT.replace("flush=True", "file=sys.stderr, flush=True") + _STDIO + """
with open(sys.argv[1], "w") as out:
    json.dump({"stdio": info, "environ": dict(os.environ)}, out)
"""


@pytest.mark.parametrize("how", ["user", "unset", "terminal"])
def test_unbuffered_output_as_the_environment_says(runner: Runner,
                                                   tmp_path: Path, how: str) -> None:
    """PYTHONUNBUFFERED set by the user, unset (a pipe: buffered), or set by ``unirank run``
    because its stdout is a terminal: the worker's stdout and stderr are what a fresh
    interpreter with its environment gets. The server's interpreter chose its buffering from
    its own start, without the terminal's PYTHONUNBUFFERED=1: a forked worker must switch."""
    (tmp_path / "stdio.py").write_text("import sys\n" + _STDIO_WORKER)
    report = tmp_path / "stdio.json"
    args = ["-n", "1", "stdio.py", str(report)]
    if how == "terminal":
        main, secondary = os.openpty()
        try:
            result = _run(runner, args, drop=("PYTHONUNBUFFERED",), stdout=secondary)
        finally:
            os.close(secondary)
            os.close(main)
    else:
        env = {"PYTHONUNBUFFERED": "1"} if how == "user" else {}
        result = _run(runner, args, env=env, drop=("PYTHONUNBUFFERED",))
    assert result.returncode == 0, result.stderr
    seen = json.loads(report.read_text())
    unbuffered = how != "unset"
    assert bool(seen["environ"].get("PYTHONUNBUFFERED")) == unbuffered
    assert seen["stdio"]["stdout"][0] is unbuffered
    assert seen["stdio"] == _fresh(_STDIO + "print(json.dumps(info))\n", seen["environ"],
                                   tmp_path)


def test_the_garbage_collector_is_on_and_frees_cycles(runner: Runner, tmp_path: Path) -> None:
    """The fork server imports with the collector off; its workers have it on, as any
    interpreter: a reference cycle made by the program is freed by a collection."""
    (tmp_path / "gc_on.py").write_text(_PARENT + """
import gc, weakref
class Node:
    pass
a, b = Node(), Node()
a.other, b.other = b, a
gone = weakref.ref(a)
del a, b
gc.collect()
print(f"GC {gc.isenabled()} {gone() is None}", flush=True)
""")
    result = _run(runner, ["-n", "1", "gc_on.py"])
    assert result.returncode == 0, result.stderr
    assert "GC True True" in result.stdout, result.stdout
