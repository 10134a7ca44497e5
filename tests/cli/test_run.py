"""``unirank run`` end to end: real workers, real torch gloo, real exit codes.

Environment variables read: the caller's environment, from which launcher variables are removed
(so that ``unirank run`` sees no outer launcher) along with OMP_NUM_THREADS (which ``unirank run``
sets when it is unset).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

import pytest

from _procs import SIGNAL_WAIT, Runner, free_port, launcher_free_environ, refusal_line

pytestmark = pytest.mark.integration

TIMEOUT = 120.0


#: the runs here start without the shell's OMP_NUM_THREADS, so that unirank run's own shows
NO_OMP = ("OMP_NUM_THREADS",)


def _env(extra: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    return launcher_free_environ(extra, drop=NO_OMP)


# A script written for torchrun; it knows nothing of unirank.
TORCHRUN_SCRIPT = """
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"rank {rank} of {world} local {os.environ['LOCAL_RANK']} sum {t.item():g}", flush=True)
dist.destroy_process_group()
"""

ENV_SCRIPT = """
import json, os, sys
names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
         "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
         "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
         "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS",
         "UNIRANK_INIT_TIMEOUT", "TORCHELASTIC_ERROR_FILE", "UNIRANK_NODE_NAME"]
private = sorted(k for k in os.environ if k.startswith("UNIRANK_")
                 and k not in ("UNIRANK_INIT_TIMEOUT", "UNIRANK_NODE_NAME",
                               "UNIRANK_ATTEMPT_DIR", "UNIRANK_STATE_MEMORY"))
main = sys.modules["__main__"]
print("ENV " + json.dumps({
    "env": {n: os.environ.get(n) for n in names}, "private": private,
    "argv": sys.argv, "file": __file__, "name": __name__, "path0": sys.path[0],
    "main_file": getattr(main, "__file__", None),
}), flush=True)
"""


def _envs(stdout: str) -> dict[int, dict[str, Any]]:
    found = [json.loads(m) for m in re.findall(r"^ENV (.*)$", stdout, re.M)]
    return {int(e["env"]["RANK"]): e for e in found}


def test_plain_torchrun_script_runs_unchanged(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "allreduce.py").write_text(TORCHRUN_SCRIPT)
    result = runner.run(["-n", "2", "allreduce.py"], drop=NO_OMP)
    assert result.returncode == 0, result.stderr
    lines = sorted(re.findall(r"rank \d of \d local \d sum \d+", result.stdout))
    assert lines == ["rank 0 of 2 local 0 sum 3", "rank 1 of 2 local 1 sum 3"]


def test_worker_environment_is_torchrun_s(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "env.py").write_text(ENV_SCRIPT)
    result = runner.run(["-n", "2", "--init-timeout", "77", "env.py", "--backend", "gloo",
                         "-n", "5"], drop=NO_OMP)
    assert result.returncode == 0, result.stderr
    envs = _envs(result.stdout)
    assert set(envs) == {0, 1}
    run_ids = set()
    for rank, info in envs.items():
        env = info["env"]
        assert isinstance(env, dict)
        assert env["LOCAL_RANK"] == str(rank) and env["ROLE_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == "0" and env["GROUP_WORLD_SIZE"] == "1"
        assert env["ROLE_NAME"] == "default"
        assert env["MASTER_ADDR"] == "localhost"  # torchrun's on one node without a port
        assert env["MASTER_PORT"] is not None and 0 < int(str(env["MASTER_PORT"])) < 65536
        assert env["TORCHELASTIC_RESTART_COUNT"] == env["TORCHELASTIC_MAX_RESTARTS"] == "0"
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        assert env["OMP_NUM_THREADS"] == "1"
        assert env["UNIRANK_INIT_TIMEOUT"] == "77"
        assert str(env["TORCHELASTIC_ERROR_FILE"]).endswith(f"/{rank}/error.json")
        # the node's name as the supervisor knows it, so the program's detection agrees
        assert env["UNIRANK_NODE_NAME"] == socket.gethostname()
        run_ids.add(env["TORCHELASTIC_RUN_ID"])
        assert info["private"] == []
        # as `python env.py --backend gloo -n 5` would see it
        assert info["argv"] == ["env.py", "--backend", "gloo", "-n", "5"]
        assert info["name"] == "__main__"
        # (python 3.9+ gives a script's __main__ an absolute __file__)
        script = str(tmp_path / "env.py")
        assert info["file"] == script and info["main_file"] == script
        assert info["path0"] == str(tmp_path)
    assert len(run_ids) == 1 and None not in run_ids
    assert envs[0]["env"]["MASTER_PORT"] == envs[1]["env"]["MASTER_PORT"]


def test_omp_num_threads_is_kept_when_set(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "env.py").write_text(ENV_SCRIPT)
    result = runner.run(["-n", "2", "env.py"], env={"OMP_NUM_THREADS": "3"}, drop=NO_OMP)
    assert result.returncode == 0, result.stderr
    assert {e["env"]["OMP_NUM_THREADS"] for e in _envs(result.stdout).values()} == {"3"}


def test_module_mode(runner: Runner, tmp_path: Path) -> None:
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "job.py").write_text(ENV_SCRIPT)
    result = runner.run(["-n", "2", "-m", "mypkg.job", "--flag", "x"], drop=NO_OMP)
    assert result.returncode == 0, result.stderr
    envs = _envs(result.stdout)
    assert set(envs) == {0, 1}
    for info in envs.values():
        assert info["name"] == "__main__"
        assert info["argv"] == [str(package / "job.py"), "--flag", "x"]
        assert info["main_file"] == str(package / "job.py")


def test_torchrun_spellings(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "env.py").write_text(ENV_SCRIPT)
    port = free_port()
    result = runner.run(["--nproc_per_node", "2", "--nnodes", "1", "--node_rank", "0",
                         "--master_addr", "127.0.0.1", "--master_port", str(port), "env.py"],
                        drop=NO_OMP)
    assert result.returncode == 0, result.stderr
    envs = _envs(result.stdout)
    assert set(envs) == {0, 1}
    assert {e["env"]["MASTER_PORT"] for e in envs.values()} == {str(port)}


def test_standalone_picks_a_free_port_even_with_master_port_set(runner: Runner,
                                                                tmp_path: Path) -> None:
    (tmp_path / "allreduce.py").write_text(TORCHRUN_SCRIPT)
    (tmp_path / "env.py").write_text(ENV_SCRIPT)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = str(busy.getsockname()[1])
        result = runner.run(["--standalone", "--nproc_per_node", "2", "env.py"],
                            env={"MASTER_PORT": taken}, drop=NO_OMP)
        assert result.returncode == 0, result.stderr
        ports = {e["env"]["MASTER_PORT"] for e in _envs(result.stdout).values()}
        assert len(ports) == 1 and taken not in ports
        # without --standalone, MASTER_PORT is honoured, and a busy one fails at once
        failed = runner.run(["-n", "2", "allreduce.py"], env={"MASTER_PORT": taken}, drop=NO_OMP)
    assert failed.returncode == 2
    assert f"MASTER_PORT='{taken}': is already in use" in failed.stderr
    assert len(failed.stderr.strip().splitlines()) == 1


def test_tag_output(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "allreduce.py").write_text(TORCHRUN_SCRIPT)
    result = runner.run(["-n", "2", "--tag-output", "allreduce.py"], drop=NO_OMP)
    assert result.returncode == 0, result.stderr
    assert "[rank0]:rank 0 of 2 local 0 sum 3\n" in result.stdout
    assert "[rank1]:rank 1 of 2 local 1 sum 3\n" in result.stdout


def test_parent_never_imports_torch(tmp_path: Path) -> None:
    (tmp_path / "allreduce.py").write_text(TORCHRUN_SCRIPT)
    probe = (
        "import sys\n"
        "from unirank.cli.main import main\n"
        "code = main(['run', '-n', '2', 'allreduce.py'])\n"
        "print('PARENT torch imported:', 'torch' in sys.modules, 'code:', code)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=_env(),
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert "PARENT torch imported: False code: 0" in result.stdout
    assert "sum 3" in result.stdout  # the workers did import it and ran


def test_init_timeout_names_the_rank_that_never_started(runner: Runner, tmp_path: Path) -> None:
    """A world of 3 nodes (one worker each) where node 2 never starts: both started ranks fail
    within the init timeout, naming rank 2."""
    (tmp_path / "allreduce.py").write_text(TORCHRUN_SCRIPT)
    port = str(free_port())
    common = ["--nnodes", "3", "-n", "1", "--master-addr", "127.0.0.1", "--master-port", port,
              "--init-timeout", "5"]
    procs = [
        runner.start([*common, "--node-rank", str(node), "allreduce.py"], drop=NO_OMP, text=True)
        for node in (0, 1)
    ]
    outputs = [proc.communicate(timeout=TIMEOUT) for proc in procs]
    for node, (proc, (_out, err)) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 1, err
        assert f"unirank: rank {node}: init timeout: 1 of 3 ranks did not join within 5 s: " \
               "rank 2 (on node rank 2)." in err
        assert f"unirank run: FAILED (exit code 1): rank {node}" in err
    assert "sum" not in outputs[0][0] + outputs[1][0]


def test_init_timeout_from_the_environment(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "env.py").write_text(ENV_SCRIPT)
    result = runner.run(["-n", "1", "env.py"], env={"UNIRANK_INIT_TIMEOUT": "42"}, drop=NO_OMP)
    assert result.returncode == 0, result.stderr
    assert _envs(result.stdout)[0]["env"]["UNIRANK_INIT_TIMEOUT"] == "42"


@pytest.mark.parametrize("args", [[], ["-n", "2"], ["-m"]])
def test_no_program_is_one_line_error(runner: Runner, tmp_path: Path, args: list[str]) -> None:
    result = runner.run(args, timeout=60, drop=NO_OMP)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "unirank run: error: no script or module to run HINT: unirank run [options] script.py "
        "[args...] or unirank run [options] -m module"
    ]


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["-n", "0"], {}, "--nproc-per-node='0': must be at least 1"),
        (["-n", "many"], {}, "--nproc-per-node='many': is not a number of workers"),
        (["-n", "gpu"], {"CUDA_VISIBLE_DEVICES": ""}, "no GPU is visible"),
        (["--nnodes", "1:4"], {}, "--nnodes='1:4': is an elastic range"),
        (["--nnodes", "2", "--node-rank", "1"], {}, "--master-addr=<unset>: is needed"),
        (["--nnodes", "2", "--node-rank", "2", "--master-addr", "h"], {},
         "--node-rank='2': must be smaller than the number of nodes, 2"),
        (["--nnodes", "2", "--master-addr", "h"], {}, "--node-rank=<unset>: is needed with 2"),
        (["--rdzv-backend", "etcd"], {}, "--rdzv-backend='etcd': is not a rendezvous"),
        (["--rdzv-endpoint", "a:1", "--master-port", "2"], {},
         "--master-port='2': disagrees with --rdzv-endpoint a:1"),
        (["--max-restarts", "-1"], {}, "--max-restarts='-1': must be at least 0"),
        (["--redirects", "7"], {}, "--redirects='7': is not 0 (none)"),
        (["--local-ranks-filter", "a"], {}, "--local-ranks-filter='a': is not a comma"),
        (["--signals-to-handle", "SIGNOPE"], {}, "--signals-to-handle='SIGNOPE': names no"),
        (["--init-timeout", "-1"], {}, "--init-timeout='-1': must be a finite number"),
        ([], {"UNIRANK_INIT_TIMEOUT": "soon"}, "UNIRANK_INIT_TIMEOUT='soon': is not a number"),
        (["--master-port", "70000"], {}, "--master-port='70000': is outside 1..65535"),
        (["--grace-period", "x"], {}, "--grace-period='x': is not a number of seconds"),
    ],
)
def test_bad_options_fail_at_once_with_one_line(
    runner: Runner, tmp_path: Path, args: list[str], env: dict[str, str], expected: str
) -> None:
    (tmp_path / "never.py").write_text("raise SystemExit('must not run')\n")
    line = refusal_line(runner.run([*args, "never.py"], env=env, timeout=60, drop=NO_OMP))
    assert expected in line
    assert "HINT:" in line


def test_missing_script_is_refused_before_any_worker_starts(runner: Runner, tmp_path: Path) -> None:
    result = runner.run(["-n", "1", "no_such_script.py"], drop=NO_OMP)
    assert result.returncode == 2  # as python no_such_script.py
    assert result.stderr.splitlines() == [
        f"unirank run: can't open file '{os.path.realpath(tmp_path)}/no_such_script.py': "
        "[Errno 2] No such file or directory"]


# -- pure helpers of the Slurm allocation case ---------------------------------------------------

def _parsed(argv: list[str]) -> argparse.Namespace:
    from unirank.cli.main import build_parser

    return build_parser("run").parse_args(["run", *argv])


def test_inner_command_for_srun_keeps_the_options_and_the_script_args() -> None:
    from unirank.cli.run import inner_command

    raw = ["-n", "4", "--tag-output", "--init-timeout", "30", "--max-restarts", "2",
           "--master-port", "2222", "train.py", "--lr", "0.1", "-n", "3"]
    args = _parsed(raw)
    args.raw_argv = raw
    inner = inner_command(args, 4, 2)
    # the node count (not given), then every option the user gave, unchanged and once each
    assert inner == [sys.executable, "-m", "unirank", "run", "--nnodes", "2", *raw]
    bare = ["train.py", "-n", "3"]
    args = _parsed(bare)
    args.raw_argv = bare
    assert inner_command(args, 2, 1) == [sys.executable, "-m", "unirank", "run", "--nnodes", "1",
                                         "--nproc-per-node", "2", *bare]
    given = ["--nnodes", "1", "--nproc_per_node=2", "train.py"]
    args = _parsed(given)
    args.raw_argv = given
    assert inner_command(args, 2, 1) == [sys.executable, "-m", "unirank", "run", *given]


def test_allocation_tasks_per_node_become_the_default_worker_count() -> None:
    from unirank.cli.run import _nproc_in_allocation, build_request
    from unirank.distenv import DistEnv

    alloc = DistEnv(launcher="slurm-allocation", num_nodes=2, launch_required=True,
                    planned_tasks=8)
    auto = _parsed(["train.py"])
    assert _nproc_in_allocation(auto, build_request(auto, {}), alloc) == 4
    given = _parsed(["-n", "2", "train.py"])
    assert _nproc_in_allocation(given, build_request(given, {}), alloc) == 2
    one_each = DistEnv(launcher="slurm-allocation", num_nodes=2, launch_required=True,
                       planned_tasks=2)
    assert _nproc_in_allocation(auto, build_request(auto, {}), one_each) == 1


# Rank 1 raises first, but rank 0 (failing because of it) exits first: the error files' times,
# not the order of exits, name the cause. The store keys order the events; nothing sleeps.
ROOT_CAUSE_SCRIPT = SIGNAL_WAIT + """
import os, signal, sys
import torch.distributed as dist
from unirank.errorfile import record_exception

on_signals(signal.SIGTERM)  # not raising from a handler (it could land inside a lock)
dist.init_process_group("gloo")
store = dist.distributed_c10d._get_default_store()
if dist.get_rank() == 1:
    record_exception(RuntimeError("the cause, on rank 1"))
    store.set("recorded", "1")
    next_signal()  # until the supervisor's SIGTERM: rank 1 ends after rank 0
    sys.exit(1)
else:
    store.wait(["recorded"])
    sys.exit(3)  # a consequence, seen first
"""


def test_summary_blames_the_rank_that_failed_first_not_the_one_that_exited_first(
    runner: Runner, tmp_path: Path,
) -> None:
    (tmp_path / "cause.py").write_text(ROOT_CAUSE_SCRIPT)
    result = runner.run(["-n", "2", "--grace-period", "30", "cause.py"], drop=NO_OMP)
    assert "rank 0 (local rank 0) on node" in result.stderr  # rank 0 ended first ...
    assert re.search(r"FAILED \(exit code 1\): rank 1 \(local rank 1\)", result.stderr), (
        result.stderr)  # ... but rank 1 is named as the cause
    assert result.returncode == 1
