"""Variables a script sets before ``import torch`` take effect in ``unirank run``'s workers as
under torchrun, forked from the fork server and with ``--no-preload``
(:mod:`unirank.supervisor.worker.lateenv`), for real: real ``unirank run`` and real torchrun running
the same script, whose results must be the same; and the rules, on mappings.

Environment variables read: the caller's environment without launcher variables; the thread
counts and the variables the script sets are dropped from it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from _procs import Runner, free_port, launcher_free_environ, run_to_end
from unirank.supervisor.worker import lateenv

TIMEOUT = 180.0
DROP = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
        *lateenv.WATCHED)
REPORTED = ("unirank: TORCH_SHOW_CPP_STACKTRACES=1, set by the script, has no effect: torch was "
            "loaded before the script ran; set it where unirank starts "
            "(TORCH_SHOW_CPP_STACKTRACES=1 unirank run ...)")

#: sets before ``import torch`` what torch reads at import; after it, what must stay ignored
_SCRIPT = """
import json, logging, os
os.environ["OMP_NUM_THREADS"] = "2"
os.environ["OPENBLAS_NUM_THREADS"] = "2"
os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
os.environ["TORCH_CPP_LOG_LEVEL"] = "INFO"
os.environ["TORCH_LOGS"] = "+dynamo"
os.environ["TORCH_SHOW_CPP_STACKTRACES"] = "1"
import torch
import torch.distributed as dist
os.environ["MKL_NUM_THREADS"] = "1"
os.environ["OMP_PROC_BIND"] = "true"
from unirank.supervisor.fork.importtime import blas_threads
dist.init_process_group("gloo")
backend = type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__
total = torch.ones(1)
dist.all_reduce(total)
with open(f"late-{dist.get_rank()}.json", "w") as out:  # torchrun's ranks share one stdout
    json.dump({
    "rank": dist.get_rank(), "threads": torch.get_num_threads(), "blas": blas_threads(),
    "debug": str(dist.get_debug_level()), "backend": backend, "sum": total.item(),
    "dynamo": logging.getLogger("torch._dynamo").level}, out)
dist.destroy_process_group()
"""


def _late(argv: Sequence[str], cwd: Path) -> tuple[list[dict[str, Any]], str]:
    """Run ``argv`` (a launcher with ``late.py``, two ranks) to the end; each rank's results,
    in rank order, and the run's stderr."""
    for rank in (0, 1):
        (cwd / f"late-{rank}.json").unlink(missing_ok=True)
    (cwd / "late.py").write_text(_SCRIPT)
    _, result = run_to_end(list(argv), cwd, launcher_free_environ(drop=DROP), TIMEOUT)
    assert result.returncode == 0, result.stderr
    found = [json.loads((cwd / f"late-{rank}.json").read_text()) for rank in (0, 1)]
    return found, result.stderr


@pytest.fixture(scope="module")
def under_torchrun(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], str]:
    """What the script gives under real torchrun, the reference."""
    return _late([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                  "--master-port", str(free_port()), "late.py"],
                 tmp_path_factory.mktemp("torchrun"))


@pytest.mark.integration
@pytest.mark.parametrize("preload", [True, False], ids=["forked", "no-preload"])
def test_variables_set_before_import_torch_act_as_under_torchrun(
        tmp_path: Path, preload: bool,
        under_torchrun: tuple[list[dict[str, Any]], str]) -> None:
    """The thread counts, the distributed debug level (DETAIL's checking wrapper around the
    group), torch's Python and C++ log levels are those torchrun gives; the changes after
    ``import torch`` are ignored, as there; the one variable that cannot take effect is named
    in one line, once (rank 0)."""
    reference, torchrun_err = under_torchrun
    assert reference == [
        {"rank": rank, "threads": 2, "blas": reference[0]["blas"], "sum": 2.0,
         "debug": "DebugLevel.DETAIL", "backend": "_ProcessGroupWrapper", "dynamo": 10}
        for rank in (0, 1)]
    args = [] if preload else ["--no-preload"]
    values, err = _late(Runner.command([*args, "-n", "2", "late.py"]), tmp_path)
    assert values == reference
    assert "[c10d]" in err and "[c10d]" in torchrun_err  # TORCH_CPP_LOG_LEVEL=INFO's lines
    assert err.count(REPORTED) == 1, err
    assert err.count("unirank: ") == 1, err  # OMP_PROC_BIND and MKL_NUM_THREADS came too late


def test_changed_names_the_variables_that_differ() -> None:
    before = {"OMP_NUM_THREADS": "1", "TORCH_LOGS": None, "TORCH_CPP_LOG_LEVEL": "INFO"}
    after = {"OMP_NUM_THREADS": "2", "TORCH_LOGS": "+dynamo", "UNRELATED": "x"}
    assert lateenv.changed(before, after) == ["OMP_NUM_THREADS", "TORCH_LOGS",
                                              "TORCH_CPP_LOG_LEVEL"]


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, None),
    ({"OMP_NUM_THREADS": "3"}, 3),
    ({"OMP_NUM_THREADS": "3,2"}, 3),
    ({"OMP_NUM_THREADS": "9"}, 4),
    ({"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "1"}, 1),
    ({"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "x"}, 3),
    ({"OMP_NUM_THREADS": "0"}, None),
])
def test_intra_op_threads_as_torch_reads_them(environ: dict[str, str],
                                              expected: int | None) -> None:
    assert lateenv.intra_op_threads(environ, cores=4) == expected


def test_what_cannot_take_effect_is_reported() -> None:
    environ = {"TORCH_SHOW_CPP_STACKTRACES": "1", "OMP_PLACES": "cores"}
    assert lateenv.apply_changes(["TORCH_SHOW_CPP_STACKTRACES", "OMP_PLACES"],
                                 environ) == ["TORCH_SHOW_CPP_STACKTRACES", "OMP_PLACES"]
    assert lateenv.ignored_line("TORCH_SHOW_CPP_STACKTRACES", environ) == REPORTED
    assert lateenv.ignored_line("OMP_PLACES", {}) == (
        "unirank: OMP_PLACES, unset by the script, stays as it was: torch was loaded before the "
        "script ran; unset it where unirank starts (env -u OMP_PLACES unirank run ...)")


def test_an_unset_thread_count_is_reported() -> None:
    """torch's default count cannot be computed again once the script unset the variables."""
    assert lateenv.apply_changes(["MKL_NUM_THREADS"], {}) == ["MKL_NUM_THREADS"]


def test_the_import_wrapper_goes_away_at_the_first_import_of_torch(tmp_path: Path) -> None:
    """Nothing is paid after that import: ``builtins.__import__`` is Python's own again."""
    code = ("import builtins, os\nimport torch\noriginal = builtins.__import__\n"
            "from unirank.supervisor.worker import lateenv\n"
            "lateenv.watch(os.environ, report=True)\n"
            "assert builtins.__import__ is not original\n"
            "import json\nassert builtins.__import__ is not original\n"
            "from torch import nn\nassert builtins.__import__ is original\nprint('OK')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=TIMEOUT, env=launcher_free_environ(drop=DROP),
                          stdin=subprocess.DEVNULL)
    assert proc.stdout == "OK\n", proc.stderr
    assert proc.stderr == ""
