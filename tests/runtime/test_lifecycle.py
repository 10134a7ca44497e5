"""init/finalize in this process (world size 1, real gloo), and the rules init applies first."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import unirank as ur
from unirank.distenv import DistEnv
from unirank.errors import ConfigError
from unirank.runtime import state
from unirank.runtime.lifecycle import (
    DEFAULT_INIT_TIMEOUT,
    launch_command,
    require_launched,
    resolve_init_timeout,
)


@pytest.fixture
def local_env() -> Iterator[DistEnv]:
    """This process seen as a serial run (whatever the shell running pytest carries)."""
    saved = state.STATE.env
    env = DistEnv(launcher="local", node_name="box")
    state.set_dist_env(env)
    try:
        yield env
    finally:
        ur.finalize()
        if dist.is_initialized():
            dist.destroy_process_group()
        state.set_dist_env(saved)


@pytest.mark.parametrize(
    ("timeout", "environ", "expected"),
    [
        (None, {}, DEFAULT_INIT_TIMEOUT),
        (None, {"UNIRANK_INIT_TIMEOUT": "12.5"}, 12.5),
        (None, {"UNIRANK_INIT_TIMEOUT": " "}, DEFAULT_INIT_TIMEOUT),
        (7, {"UNIRANK_INIT_TIMEOUT": "12.5"}, 7.0),
    ],
)
def test_resolve_init_timeout(
    timeout: float | None, environ: dict[str, str], expected: float
) -> None:
    assert resolve_init_timeout(timeout, environ) == expected


@pytest.mark.parametrize("raw", ["abc", "0", "-3", "nan", "inf"])
def test_bad_init_timeout_variable_is_named(raw: str) -> None:
    with pytest.raises(ConfigError, match=rf"^UNIRANK_INIT_TIMEOUT={raw!r}: (is not|must be) a"):
        resolve_init_timeout(None, {"UNIRANK_INIT_TIMEOUT": raw})


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_bad_init_timeout_argument_is_named(bad: float) -> None:
    with pytest.raises(ConfigError, match=r"^init_timeout="):
        resolve_init_timeout(bad, {})


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["examples/helloworld.py", "--backend", "gloo"],
         "srun python3 examples/helloworld.py --backend gloo"),
        (["/usr/local/bin/unirank", "hello"], "srun /usr/local/bin/unirank hello"),
        (["train.py", "--name", "my run"], "srun python3 train.py --name 'my run'"),
    ],
)
def test_launch_command(argv: list[str], expected: str) -> None:
    assert launch_command(argv, "/usr/bin/python3") == expected


def test_allocation_shell_with_several_tasks_names_the_srun_command() -> None:
    env = DistEnv(launcher="slurm-allocation", launch_required=True, planned_tasks=4)
    with pytest.raises(ConfigError) as info:
        require_launched(env, ["job.py"], "/usr/bin/python3")
    message = str(info.value)
    assert message.startswith("SLURM_STEP_ID=<unset>: this is a Slurm allocation shell")
    assert "holding 4 tasks" in message
    assert message.endswith("HINT: start the tasks with: srun python3 job.py")


@pytest.mark.parametrize("planned", [None, 1])
def test_allocation_shell_with_one_task_runs_serially(planned: int | None) -> None:
    env = DistEnv(launcher="slurm-allocation", launch_required=True, planned_tasks=planned)
    assert not env.must_launch
    assert (env.rank, env.world_size) == (0, 1)
    require_launched(env, ["job.py"], "/usr/bin/python3")  # no error: it runs in place


def test_init_world_of_one_and_finalize(local_env: DistEnv) -> None:
    assert not ur.is_initialized()
    assert ur.backend() is None
    ur.init("gloo")
    assert ur.is_initialized()
    assert (ur.backend(), ur.get_rank(), ur.get_world_size()) == ("gloo", 0, 1)
    assert ur.device() == torch.device("cpu")
    # real torch collectives through the world of one
    assert ur.all_reduce(torch.tensor([3.0]), "max").tolist() == [3.0]
    assert ur.all_gather("x") == ["x"]
    ur.init("gloo")  # a second init keeps the group
    assert ur.is_initialized()
    ur.finalize()
    assert not ur.is_initialized()
    assert ur.backend() is None


def test_init_auto_picks_gloo_here(local_env: DistEnv) -> None:
    ur.init()
    assert ur.backend() == "gloo"


def test_init_explicit_nccl_without_cuda_is_a_config_error(local_env: DistEnv) -> None:
    if torch.cuda.is_available():
        pytest.skip("this check needs a machine without CUDA")
    with pytest.raises(ConfigError, match=r"^backend='nccl'"):
        ur.init("nccl")
    assert not ur.is_initialized()


def test_users_own_group_is_adopted_and_left_alone(local_env: DistEnv) -> None:
    store = dist.HashStore()  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    ur.init("gloo")
    assert ur.backend() == "gloo"
    assert ur.all_reduce(2) == 2
    ur.finalize()
    assert dist.is_initialized(), "finalize must not destroy a group unirank did not create"


def test_a_horovod_still_being_imported_is_not_a_live_backend(
        local_env: DistEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """While ``import horovod.torch`` runs (in this thread or another), the module is in
    ``sys.modules`` without ``is_initialized`` yet: no backend is live, and nothing raises."""
    monkeypatch.setitem(sys.modules, "horovod.torch", types.ModuleType("horovod.torch"))
    assert state.active() is None
    assert not state.is_initialized()


JOIN_ACROSS_RESTART_COUNTS = """
import unirank as ur
ur.init("gloo", timeout=20)
ur.barrier()
print("joined", ur.get_rank(), ur.get_world_size(), flush=True)
ur.finalize()
"""


def test_ranks_whose_nodes_count_restarts_differently_start_one_group(tmp_path: Path) -> None:
    """A node that joined an elastic job starts at TORCHELASTIC_RESTART_COUNT=0 while the
    others count their restarts: ``ur.init`` under one such rank each must still start one
    group (real processes, a store of rank 0's)."""
    codes, ended = _two_ranks(tmp_path, JOIN_ACROSS_RESTART_COUNTS, lambda rank: {
        "UNIRANK_HANG_REPORT_AFTER": "off", "TORCHELASTIC_RESTART_COUNT": str(1 - rank),
        "TORCHELASTIC_MAX_RESTARTS": "3"})
    assert codes == [0, 0], ended
    assert [out for out, _ in ended] == ["joined 0 2\n", "joined 1 2\n"], ended


def _two_ranks(tmp_path: Path, program: str, extra: Callable[[int], dict[str, str]]
               ) -> tuple[list[int], list[tuple[str, str]]]:
    """Run ``program`` as ranks 0 and 1 of a world of 2 on loopback (each its own process, as
    srun one task per rank starts them; ``extra(rank)``: more variables): their exit codes and
    (stdout, stderr)."""
    import subprocess

    from _procs import free_port, launcher_free_environ

    script = tmp_path / "program.py"
    script.write_text(program)
    port = str(free_port())
    procs = [subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=launcher_free_environ({
            "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, **extra(rank)}))
        for rank in (0, 1)]
    ended = [p.communicate(timeout=120) for p in procs]
    return [p.returncode for p in procs], ended


LEFT_ALIVE = """
import atexit
import os

import torch
import torch.distributed as dist

# registered before ``ur.init``: runs after unirank's own handlers (atexit is last in, first out)
atexit.register(lambda: os.write(1, f"group at exit: {dist.is_initialized()}\\n".encode()))

import unirank as ur

ur.init("gloo", timeout=20)
dist.all_reduce(torch.ones(3))
"""


def test_a_group_the_program_left_alive_is_ended_at_exit(tmp_path: Path) -> None:
    """A program that never calls ``destroy_process_group`` (most do not) has its group ended
    at the interpreter's exit, so torch 2.13's teardown of a live gloo group cannot abort the
    rank after its last line (SIGABRT in about half of two-rank torchrun runs here): each
    rank's last atexit handler sees no group, and both end 0 (real processes)."""
    codes, ended = _two_ranks(tmp_path, LEFT_ALIVE, lambda rank: {})
    assert [out for out, _ in ended] == ["group at exit: False\n"] * 2, ended
    assert codes == [0, 0], ended
