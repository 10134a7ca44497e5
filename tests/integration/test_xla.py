"""The xla-tpu backend with the real torch_xla 2.9.0 on XLA:CPU (``.venv-xla``, ``scripts/setup
--xla``), and unirank on the low end of its torch requirement (torch 2.9.0 in that environment).

What runs here: one XLA:CPU process (world size 1) through ``ur.init``/``Parallel``, the
collectives and training helpers on the XLA device, ``unirank hello``; and the refusal of more
than one XLA:CPU process. What cannot run here (no TPU): several XLA processes, torch_xla's
``xmp.spawn`` with more than one process, the ``xla://`` group; those paths are not exercised.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from _procs import launcher_free_environ
from conftest import REPO_ROOT

pytestmark = pytest.mark.integration

JOB = str(Path(__file__).parent / "scripts" / "backend_job.py")
CPU = {"PJRT_DEVICE": "CPU"}
#: the tests re-run on torch 2.9: those that use torch in the test process (the runtime, the
#: join check on torch's TCPStore, error files as torch's ``@record`` writes them) and those
#: whose workers or commands use it (Parallel's spawn, the bootstrap's store, the timeline's
#: keys, ``unirank run`` end to end, torch's own torchrun, the CLI's commands). Left out: the
#: tests of pure code (launchers, planner, output, summary, host lists, ports), which torch's
#: version cannot change, and the engine's own behaviour (signals, teardown, restarts, output
#: routing), which is the same whatever the workers import.
#: of tests/cli, the modules whose workers use torch beyond the bootstrap's store and group:
#: collectives (hello, reduce), the program's own process group (run), the hang watcher and its
#: flight recorder (on_hang). The rest of tests/cli proves the engine and the CLI, which import
#: no torch: the same whatever torch the workers run (the main lane runs them)
LOW_END_TESTS = ["tests/runtime", "tests/test_joincheck.py", "tests/test_errorfile.py",
                 "tests/supervisor/worker/test_bootstrap.py",
                 "tests/supervisor/worker/test_timeline.py",
                 "tests/cli/test_hello.py", "tests/cli/test_reduce.py", "tests/cli/test_run.py",
                 "tests/cli/test_on_hang_keyword.py"]
#: tests under LOW_END_TESTS that prove only the engine or the CLI's parsing (a renamed one is
#: simply run again: --deselect ignores ids it does not find)
LOW_END_DESELECTED = [
    "tests/cli/test_run.py::test_tag_output",
    "tests/cli/test_run.py::test_parent_never_imports_torch",
    "tests/cli/test_run.py::test_init_timeout_from_the_environment",
    "tests/cli/test_run.py::test_omp_num_threads_is_kept_when_set",
    "tests/cli/test_run.py::test_standalone_picks_a_free_port_even_with_master_port_set",
    "tests/cli/test_run.py::test_torchrun_spellings",
    "tests/cli/test_run.py::test_summary_blames_the_rank_that_failed_first_not_the_one_that_exited_first",
    "tests/bench/test_bench_cli.py::test_plot_writes_a_png_with_one_line_per_collective",
    # Parallel's spawn: a failed worker named and the others stopped, workers dying with
    # their parent (the engine's teardown)
    "tests/runtime/test_spawn.py::test_failing_worker_is_named_and_the_others_are_stopped",
    "tests/runtime/test_spawn.py::test_workers_die_with_a_sigkilled_parent",
]
#: tests under LOW_END_TESTS that need what only the main interpreter has (the test extra's
#: pytorch-ignite, Horovod): .venv-xla holds torch, torch_xla and unirank with its notebook
#: extra (cloudpickle: ur.launch from ``-c`` or stdin sends functions by value)
LOW_END_IGNORED = ["tests/runtime/test_idist_compat.py", "tests/runtime/test_idist_names.py",
                   "tests/runtime/test_idist_horovod.py", "tests/runtime/test_ignite_suite.py",
                   "tests/runtime/test_notebook.py",  # the notebook lane: not in that venv
                   # the engine's own behaviour, whatever torch the workers run: ur.launch's
                   # shipping of functions and results (cloudpickle, the relay), a spawned
                   # worker's one-line errors and tracebacks, Parallel's stop on SIGTERM
                   "tests/runtime/test_launch.py", "tests/runtime/test_spawned_worker.py",
                   "tests/runtime/test_parallel_stop.py",
                   # torch 2.13's own launcher tests, vendored for the pinned torch, against
                   # torch 2.13's torchrun (2.9's differs); and torchrun 2.13's defaults
                   "tests/runtime/test_torchrun_suite.py"]
#: single tests of the same kind (they need Horovod or ignite in the Python that runs them)
LOW_END_NEEDS_MAIN = [
    "tests/runtime/test_backends_horovod_xla.py::test_auto_picks_horovod_under_horovodrun_only",
    "tests/runtime/test_idist_ignite_inputs.py::test_ignite_itself_gives_the_expected_values",
]


def run(cmd: list[str], timeout: float = 300, env: dict[str, str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT,
                          stdin=subprocess.DEVNULL,
                          env=launcher_free_environ({**CPU, **(env or {})}))
    if check:
        assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def job_result(stdout: str) -> dict[str, Any]:
    found = re.findall(r"RESULT (\{.*\})", stdout)
    assert len(found) == 1, stdout
    result: dict[str, Any] = json.loads(found[0])
    return result


@pytest.mark.parametrize("how", [["xla-tpu"], ["xla", "1"]], ids=["as-launched", "Parallel-1"])
def test_collectives_and_helpers_on_the_xla_device(xla_python: str, how: list[str]) -> None:
    r = job_result(run([xla_python, JOB, *how]).stdout)
    assert (r["backend"], r["device"], r["rank"], r["world"]) == ("xla-tpu", "xla:0", 0, 1)
    assert (r["sum"], r["mean"], r["min"], r["max"], r["product"]) == (1, 1.0, 1.5, 1, 1)
    assert (r["gather_tensor"], r["gather_obj"], r["bcast_path"]) == (
        [0, 0], [{"rank": 0, "t": [0, "x"]}], "/who0")
    # auto_model: not wrapped; auto_optim: the same SGD object, its step through xm.optimizer_step
    assert r["model"] == "Linear"
    assert r["optimizer"] == "torch.optim.sgd.SGD" and r["plain_optimizer"] is False
    weight_step, bias_step = r["step"]
    assert weight_step == pytest.approx([-0.1] * 6, abs=1e-6)  # x = 1 on the one rank
    assert bias_step == pytest.approx([-0.1, -0.1], abs=1e-6)
    assert r["shard"] == [0, 1, 2, 3]  # batches came through the XLA loader, all of them


def test_hello_prints_the_seed_line_with_xla_tpu(xla_python: str) -> None:
    unirank = str(Path(xla_python).parent / "unirank")
    out = run([unirank, "hello", "--backend", "xla-tpu"]).stdout
    assert re.fullmatch(r"\[http://127\.0\.0\.1:\d+\] hello from \[[^:\]]+:xla-tpu\] "
                        r"process 0/1\n", out), out


@pytest.mark.parametrize("cmd", [["hello", "-n", "2", "--backend", "xla-tpu"],
                                 ["run", "-n", "2", JOB, "xla"]], ids=["hello", "run"])
def test_two_xla_cpu_processes_are_refused_in_one_line(xla_python: str, cmd: list[str]) -> None:
    proc = run([xla_python, "-m", "unirank", *cmd], check=False, timeout=120)
    assert proc.returncode != 0
    assert "asks for 2 XLA processes on the CPU" in proc.stderr
    assert "pytorch/xla/issues/9089" in proc.stderr
    assert "Expected 2 threads to join the rendezvous" not in proc.stderr  # never XLA's abort


def test_unirank_passes_its_unit_tests_on_torch_2_9(xla_python: str) -> None:
    """The low end of the torch requirement that CI proves: the tests that use torch (see
    :data:`LOW_END_TESTS`) run again under .venv-xla's torch 2.9.0 (pytest inside pytest)."""
    version = run([xla_python, "-c", "import torch; print(torch.__version__)"]).stdout
    assert version.startswith("2.9."), version
    deselect = [arg for test in LOW_END_DESELECTED + LOW_END_NEEDS_MAIN
                for arg in ("--deselect", test)]
    deselect += [f"--ignore={path}" for path in LOW_END_IGNORED]
    proc = run([xla_python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m",
                "not slurm and not mpi", *deselect, *LOW_END_TESTS], timeout=1200, check=False)
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in tail and "failed" not in tail, tail

