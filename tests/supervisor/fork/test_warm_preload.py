"""The fork server's warm stage (:data:`unirank.supervisor.fork.client.WARM_PRELOAD`): a job whose
script builds a DDP model finds what DDP's first step imports already imported, and still gets
a worker that is a fresh interpreter where it matters (no thread in the server, import-time
variables its own); other jobs do not pay for it; a DDP first step works with and without the
fork server.

The end-to-end tests run ``unirank run`` for real.

Environment variables read: the caller's environment, without launcher variables and without
UNIRANK_NO_PRELOAD (each test says whether it wants the server).
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest

from _procs import Runner, assert_snippet_runs
from unirank.supervisor.fork.client import WARM_PRELOAD, ForkServer, warm_modules

TIMEOUT = 180.0
FALLBACK = "unirank run: starting workers as their own interpreters"

# What the worker finds imported when the script starts, and who its parent is.
_AT_START = """
import json, os, sys
print("AT_START " + json.dumps({
    "rank": int(os.environ["RANK"]), "ppid": os.getppid(),
    "modules": {name: name in sys.modules for name in sys.argv[1:]}}), flush=True)
"""

# One DDP training step (AdamW); each rank prints its parameters after it.
_DDP_STEP = _AT_START + """
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)  # different weights: DDP's broadcast must make them equal
    model = DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    torch.manual_seed(100 + rank)  # different data: the gradients must be averaged
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    print("STEP " + json.dumps({"rank": rank, "params": flat.tolist()}), flush=True)
    dist.destroy_process_group()


main()
"""

_HELLO = _AT_START + "print('hello', flush=True)\n"


def _tagged(stdout: str, tag: str) -> list[dict[str, Any]]:
    found = [json.loads(m) for m in re.findall(rf"^{tag} (.*)$", stdout, re.M)]
    return sorted(found, key=lambda value: int(value["rank"]))


# -- which jobs get the warm stage ----------------------------------------------------------------


@pytest.mark.parametrize("text, warm", [
    ("from torch.nn.parallel import DistributedDataParallel as DDP\n", True),
    ("from torch.distributed.fsdp import fully_shard\n", True),
    ("model = torch.compile(model)\n", True),
    ("model = ur.auto_model(model)\n", True),
    ("import torch.distributed as dist\ndist.init_process_group('gloo')\n", False),
])
def test_warm_modules_follow_the_script(tmp_path: Path, text: str, warm: bool) -> None:
    (tmp_path / "job.py").write_text(text)
    assert warm_modules([str(tmp_path / "job.py"), "--epochs", "1"]) == (
        WARM_PRELOAD if warm else ())


def test_warm_modules_need_a_readable_script(tmp_path: Path) -> None:
    (tmp_path / "ddp.py").write_text("DistributedDataParallel\n")
    assert warm_modules(["-m", "ddp"]) == ()
    assert warm_modules(["--call", str(tmp_path / "ddp.py")]) == ()
    assert warm_modules([str(tmp_path / "missing.py")]) == ()
    assert warm_modules([]) == ()


def test_what_the_warm_stage_imports_starts_no_thread() -> None:
    """With the server's OPENBLAS_NUM_THREADS=1, importing the warm modules after the default
    ones leaves one thread and no CUDA (:func:`fork_hazard`), and does not import
    ``torch._dynamo`` (which would expose torch's hang at a DDP script's end)."""
    assert_snippet_runs(
        "import os, sys\n"
        "os.environ['OPENBLAS_NUM_THREADS'] = '1'\n"
        "import importlib\n"
        "from unirank.supervisor.fork.client import DEFAULT_PRELOAD, WARM_PRELOAD\n"
        "for name in (*DEFAULT_PRELOAD, *WARM_PRELOAD): importlib.import_module(name)\n"
        "from unirank.supervisor.fork.server import fork_hazard\n"
        "assert fork_hazard() is None, fork_hazard()\n"
        "assert 'torch._dynamo' not in sys.modules\n", timeout=120)


def _server(prefixes: tuple[str, ...], imported_with: Mapping[str, str]) -> ForkServer:
    """A :class:`ForkServer` with no process behind it (only :meth:`why_not` is asked)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.close()
    server = ForkServer(cast(Any, None), ours, imported_with, prefixes)
    server._environ = dict(imported_with)
    return server


def test_a_warm_variable_that_differs_is_not_forked() -> None:
    """A worker whose SYMPY_* or MPMATH_* differs from the server's imports cannot use them;
    without the warm stage the same worker can be forked."""
    common = {"PATH": "/bin", "SYMPY_USE_CACHE": "yes"}
    warm = _server(("SYMPY_", "MPMATH_"), common)
    assert warm.why_not({**common, "RANK": "1"}) is None
    assert warm.why_not({**common, "SYMPY_USE_CACHE": "no"}) == (
        "SYMPY_USE_CACHE differs between this worker and the fork server's imports")
    assert warm.why_not({**common, "MPMATH_NOGMPY": "1"}) == (
        "MPMATH_NOGMPY differs between this worker and the fork server's imports")
    cold = _server((), common)
    assert cold.why_not({**common, "SYMPY_USE_CACHE": "no"}) is None


# -- end to end -----------------------------------------------------------------------------------

#: the runs here choose the fork server or not themselves: the no-preload lane's switch is dropped
_PRELOAD_SWITCH = ("UNIRANK_NO_PRELOAD",)
_WATCHED = ["sympy", "torch.fx.experimental.symbolic_shapes", "torch.distributed.tensor",
            "torch._dynamo"]


@pytest.mark.integration
@pytest.mark.parametrize("flags", [[], ["--no-preload"]], ids=["forked", "no-preload"])
def test_a_ddp_first_step(runner: Runner, flags: list[str]) -> None:
    """Two ranks take one DDP + AdamW step and end with the same parameters. Forked, the warm
    modules were imported before the script ran (by the server: the workers' parent), and
    ``torch._dynamo`` was not; with ``--no-preload`` nothing was."""
    runner.script("ddp_step.py", _DDP_STEP)
    result = runner.run([*flags, "-n", "2", "ddp_step.py", *_WATCHED], drop=_PRELOAD_SWITCH,
                        timeout=TIMEOUT)
    pid = result.pid
    assert result.returncode == 0, result.stderr
    assert FALLBACK not in result.stderr
    start = _tagged(result.stdout, "AT_START")
    assert [s["rank"] for s in start] == [0, 1], result.stdout
    forked = not flags
    for seen in start:
        assert (seen["ppid"] != pid) is forked
        assert seen["modules"] == {"sympy": forked, "torch.fx.experimental.symbolic_shapes": forked,
                                   "torch.distributed.tensor": forked, "torch._dynamo": False}
    steps = _tagged(result.stdout, "STEP")
    assert [s["rank"] for s in steps] == [0, 1]
    assert steps[0]["params"] == steps[1]["params"]


@pytest.mark.integration
def test_a_job_without_ddp_gets_no_warm_stage(runner: Runner) -> None:
    """A script that names no DDP is forked from a server that imported only the default
    modules: without :func:`warm_modules` it would wait for sympy's import too."""
    runner.script("hello.py", _HELLO)
    result = runner.run(["-n", "2", "hello.py", *_WATCHED], drop=_PRELOAD_SWITCH,
                        timeout=TIMEOUT)
    pid = result.pid
    assert result.returncode == 0, result.stderr
    start = _tagged(result.stdout, "AT_START")
    assert [s["rank"] for s in start] == [0, 1]
    assert all(s["ppid"] != pid for s in start)  # forked from the server
    assert all(not any(s["modules"].values()) for s in start), start
