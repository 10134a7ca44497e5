"""``unirank run`` as a drop-in for torchrun, with real workers: torchrun's options, ``@record``,
the store outliving rank 0, the root cause when every rank fails, restarts and log files; and
``Parallel`` giving its workers exactly what ``unirank run`` gives.

Environment variables read: the caller's environment, from which launcher variables are removed
(see ``tests/cli/test_run.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from unirank.supervisor.summary import RunResult, WorkerExit, format_summary

sys.path.insert(0, str(Path(__file__).parent))
from test_run import NO_OMP, _env

from _procs import Runner, free_port

pytestmark = pytest.mark.integration

# The official DDP tutorial's shape: main decorated with torch's @record.
RECORD_TRAINER = """
import os
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    dist.init_process_group("gloo")
    dist.barrier()
    if os.environ.get("FAIL_RANK") == os.environ["RANK"]:
        raise ValueError(f"real failure of rank {os.environ['RANK']}")
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""


def test_record_decorated_trainer_shows_the_rank_s_real_exception(runner: Runner,
                                                                  tmp_path: Path) -> None:
    (tmp_path / "trainer.py").write_text(RECORD_TRAINER)
    result = runner.run(["-n", "2", "trainer.py"], env={"FAIL_RANK": "1"}, drop=NO_OMP)
    assert result.returncode == 1, result.stderr
    assert "FileNotFoundError" not in result.stderr
    summary = result.stderr[result.stderr.index("unirank run: FAILED"):]
    assert summary.startswith("unirank run: FAILED (exit code 1): rank 1 (local rank 1)")
    assert "ValueError: real failure of rank 1" in summary


# Rank 0's program ends at once; rank 1 uses the store only after that.
STORE_AFTER_RANK_0 = """
import os, sys, time, datetime
rank = int(os.environ["RANK"])
flag = os.path.join(sys.argv[1], "rank0.done")
if rank == 0:
    with open(flag + ".tmp", "w") as fh:
        fh.write(str(os.getpid()))
    os.rename(flag + ".tmp", flag)  # the last thing rank 0's program does
    sys.exit(0)
import select
deadline = time.monotonic() + 60
while not os.path.exists(flag):
    assert time.monotonic() < deadline, "rank 0 never finished"
    select.select([], [], [], 0.05)
import torch.distributed as dist
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                      datetime.timedelta(seconds=30))
store.set("late", "ok")
print("late rank used the store:", store.get("late").decode(), flush=True)
"""


def test_store_outlives_rank_0_s_program(runner: Runner, tmp_path: Path) -> None:
    """Defect 2: rank 1 joins the store only after rank 0's program ended."""
    (tmp_path / "late.py").write_text(STORE_AFTER_RANK_0)
    result = runner.run(["-n", "2", "late.py", str(tmp_path)], drop=NO_OMP)
    assert result.returncode == 0, result.stderr
    assert "late rank used the store: ok" in result.stdout


def test_store_outlives_rank_0_s_program_with_no_python(runner: Runner, tmp_path: Path) -> None:
    """With --no-python rank 0's program replaces the bootstrap: a store host serves instead."""
    (tmp_path / "late.py").write_text(STORE_AFTER_RANK_0)
    (tmp_path / "late.sh").write_text(f"#!/bin/sh\nexec {sys.executable} late.py \"$@\"\n")
    (tmp_path / "late.sh").chmod(0o755)
    result = runner.run(["-n", "2", "--no-python", "./late.sh", str(tmp_path)], drop=NO_OMP)
    assert result.returncode == 0, result.stderr
    assert "late rank used the store: ok" in result.stdout


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
def test_ranks_that_only_print_succeed_pinned_to_one_core(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "s.py").write_text("import os\nprint('rank', os.environ['RANK'], flush=True)\n")
    for _ in range(3):
        result = runner.run(["-n", "4", "s.py"], prefix=["taskset", "-c", "0"], drop=NO_OMP)
        assert result.returncode == 0, result.stderr
        assert sorted(result.stdout.splitlines()) == [f"rank {r}" for r in range(4)]


ALL_FAIL = """
import os
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
raise RuntimeError(f"every rank fails: {os.environ['RANK']}")
"""


def test_all_ranks_failing_together_exit_1_never_143(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "allfail.py").write_text(ALL_FAIL)
    for _ in range(3):
        result = runner.run(["-n", "3", "allfail.py"], drop=NO_OMP)
        assert result.returncode == 1, result.stderr
        headline = next(line for line in result.stderr.splitlines()
                        if line.startswith("unirank run: FAILED"))
        assert headline.startswith("unirank run: FAILED (exit code 1): rank ")
        assert "killed by" not in headline


def test_a_worker_stopped_while_failing_is_blamed_with_its_own_exit_code() -> None:
    """The rule behind the test above, without the race: rank 1 recorded its error first and was
    then killed by the teardown's SIGTERM; rank 0 ended on its own with 1."""
    cause = WorkerExit(rank=1, local_rank=1, node="n", returncode=-15, error="RuntimeError: x",
                       stopped=True, recorded_exit_code=1)
    other = WorkerExit(rank=0, local_rank=0, node="n", returncode=1)
    result = RunResult(exits=(other, cause), first_failure=cause)
    assert result.exit_code == 1
    text = format_summary(result)
    assert text.startswith("unirank run: FAILED (exit code 1): rank 1 (local rank 1) on node n: "
                           "failed (exit code 1), then was stopped by the teardown")
    assert "SIGTERM" not in text.splitlines()[0]


ENV_AND_FAIL = """
import json, os, sys
print("ENV " + json.dumps({k: v for k, v in os.environ.items()
                           if k in {NAMES}}), flush=True)
if os.environ.get("FAIL_FIRST") and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" \\
        and os.environ["RANK"] == "1":
    raise SystemExit(5)
"""
NAMES = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
         "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
         "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
         "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
         "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS",
         "UNIRANK_INIT_TIMEOUT"]


def _envs(stdout: str) -> list[dict[str, str]]:
    return [json.loads(line[4:]) for line in stdout.splitlines() if line.startswith("ENV ")]


def test_the_multinode_tutorial_s_options_run(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "trainer.py").write_text(ENV_AND_FAIL.replace("{NAMES}", repr(set(NAMES))))
    port = free_port()
    result = runner.run(["--nnodes", "1", "--nproc_per_node", "2", "--rdzv_id", "1",
                         "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
                         "--max_restarts", "0", "trainer.py"], drop=NO_OMP)
    assert result.returncode == 0, result.stderr
    envs = sorted(_envs(result.stdout), key=lambda e: e["RANK"])
    assert [e["RANK"] for e in envs] == ["0", "1"]
    for env in envs:
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", str(port))
        assert env["TORCHELASTIC_RUN_ID"] == "1"
        assert env["TORCHELASTIC_MAX_RESTARTS"] == "0"


def test_max_restarts_turns_a_first_attempt_failure_into_success(runner: Runner,
                                                                 tmp_path: Path) -> None:
    (tmp_path / "trainer.py").write_text(ENV_AND_FAIL.replace("{NAMES}", repr(set(NAMES))))
    result = runner.run(["-n", "2", "--max-restarts", "1", "trainer.py"],
                        env={"FAIL_FIRST": "1"}, drop=NO_OMP)
    assert result.returncode == 0, result.stderr
    counts = sorted((e["TORCHELASTIC_RESTART_COUNT"], e["RANK"]) for e in _envs(result.stdout))
    assert counts == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    assert {e["TORCHELASTIC_MAX_RESTARTS"] for e in _envs(result.stdout)} == {"1"}
    assert "attempt 0 failed (rank 1: exit code 5); restarting the workers (1 of 1 restarts)" \
        in result.stderr
    assert "unirank run: succeeded after 1 restart" in result.stderr
    # without a restart left, the same failure is the job's
    failed = runner.run(["-n", "2", "trainer.py"], env={"FAIL_FIRST": "1"}, drop=NO_OMP)
    assert failed.returncode == 5, failed.stderr


TALK = """
import os, sys
print(f"out of {os.environ['LOCAL_RANK']}", flush=True)
print(f"err of {os.environ['LOCAL_RANK']}", file=sys.stderr, flush=True)
"""


def test_log_dir_and_redirects_write_torchrun_s_layout(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "talk.py").write_text(TALK)
    logs = tmp_path / "logs"
    result = runner.run(["-n", "2", "--rdzv-id", "job9", "--log-dir", str(logs),
                         "--redirects", "3", "talk.py"], drop=NO_OMP)
    assert result.returncode == 0, result.stderr
    assert "out of" not in result.stdout and "err of" not in result.stderr
    for local in (0, 1):
        [folder] = logs.glob(f"job9_*/attempt_0/{local}")
        assert (folder / "stdout.log").read_text() == f"out of {local}\n"
        assert (folder / "stderr.log").read_text() == f"err of {local}\n"


def test_tee_and_local_ranks_filter(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "talk.py").write_text(TALK)
    logs = tmp_path / "logs"
    result = runner.run(["-n", "2", "--rdzv-id", "t", "--log-dir", str(logs), "--tee", "1",
                         "--local-ranks-filter", "1", "talk.py"], drop=NO_OMP)
    assert result.returncode == 0, result.stderr
    # rank 0 filtered off the console; a teed line there has torchrun's prefix, an untouched
    # stream (stderr) and the log file none
    assert result.stdout == "[default1]:out of 1\n"
    assert "\nerr of 1" in "\n" + result.stderr and "err of 0" not in result.stderr
    [folder] = logs.glob("t_*/attempt_0/0")
    assert (folder / "stdout.log").read_text() == "out of 0\n"
    assert not (folder / "stderr.log").exists()


def test_tee_wins_over_redirects_with_the_prefix_template(runner: Runner,
                                                          tmp_path: Path) -> None:
    """torchrun 2.13 (checked by hand): ``--redirects 3 --tee 3`` shows both streams on the
    console, each line after TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE's expansion."""
    (tmp_path / "talk.py").write_text(TALK)
    logs = tmp_path / "logs"
    result = runner.run(["-n", "2", "--rdzv-id", "t", "--log-dir", str(logs), "--redirects",
                         "3", "--tee", "3", "talk.py"], drop=NO_OMP,
                        env={"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "<${role_name}|${rank}>"})
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["<default|0>out of 0", "<default|1>out of 1"]
    assert "<default|1>err of 1" in result.stderr.splitlines()
    [folder] = logs.glob("t_*/attempt_0/1")  # a new folder each run (runfolder)
    assert (folder / "stderr.log").read_text().startswith("err of 1\n")


FRUIT = """
import os, sys
rank = os.environ["LOCAL_RANK"]
for word in ("apple pie", "banana", "orange, juice", "kiwi"):
    print(f"out {rank} {word}", flush=True)
    print(f"err {rank} {word}", file=sys.stderr, flush=True)
"""


def _filtered(logs: Path) -> dict[str, list[str]]:
    """Each ``filtered_std*.log`` of the run's first attempt: its lines, sorted."""
    (attempt,) = logs.glob("*/attempt_0")
    return {path.name: sorted(path.read_text().splitlines())
            for path in sorted(attempt.glob("filtered_*.log"))}


def test_duplicate_filters_copy_the_lines_torchrun_copies(runner: Runner,
                                                          tmp_path: Path) -> None:
    """``--duplicate-stdout-filters`` / ``--duplicate-stderr-filters`` with ``--tee``: the
    attempt's ``filtered_stdout.log`` and ``filtered_stderr.log`` hold what torchrun's own
    hold (``,,`` a comma in a filter; ``[default0]:`` before each line)."""
    torchrun = shutil.which("torchrun")
    assert torchrun, "torchrun comes with torch"
    (tmp_path / "fruit.py").write_text(FRUIT)
    options = ["--nproc-per-node", "2", "--tee", "3", "--duplicate-stdout-filters",
               "apple,orange,, juice", "--duplicate-stderr-filters", "kiwi"]
    ours = runner.run([*options, "--log-dir", str(tmp_path / "ours"), "fruit.py"], drop=NO_OMP)
    assert ours.returncode == 0, ours.stderr
    theirs = subprocess.run([torchrun, "--standalone", *options, "--log-dir",
                             str(tmp_path / "theirs"), "fruit.py"], cwd=tmp_path,
                            env=runner.environ(drop=NO_OMP), capture_output=True, text=True,
                            timeout=runner.timeout, check=False)
    assert theirs.returncode == 0, theirs.stderr
    assert _filtered(tmp_path / "ours") == _filtered(tmp_path / "theirs") == {
        "filtered_stderr.log": ["[default0]:err 0 kiwi", "[default1]:err 1 kiwi"],
        "filtered_stdout.log": ["[default0]:out 0 apple pie", "[default0]:out 0 orange, juice",
                                "[default1]:out 1 apple pie", "[default1]:out 1 orange, juice"]}


def test_role_no_python_and_noted_options(runner: Runner, tmp_path: Path) -> None:
    script = tmp_path / "prog.sh"
    script.write_text("#!/bin/sh\necho \"shell rank $RANK role $ROLE_NAME of $WORLD_SIZE\"\n")
    script.chmod(0o755)
    result = runner.run(["-n", "2", "--role", "trainer", "--no-python",
                         "--monitor-interval", "5", "--start-method", "fork", str(script)],
                        drop=NO_OMP)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["shell rank 0 role trainer of 2",
                                                  "shell rank 1 role trainer of 2"]
    assert "unirank run: note: --monitor-interval is accepted but has no effect" in result.stderr
    assert "unirank run: note: --start-method is accepted but has no effect" in result.stderr


def test_every_torchrun_option_is_accepted() -> None:
    import argparse

    from torch.distributed.run import get_args_parser

    from unirank.cli.run import add_arguments

    ours = argparse.ArgumentParser()
    add_arguments(ours)
    theirs = get_args_parser()
    missing = [option for action in theirs._actions for option in action.option_strings
               if option not in ours._option_string_actions]
    assert missing == []


def test_an_unknown_option_is_one_line_naming_it(runner: Runner, tmp_path: Path) -> None:
    result = runner.run(["--no-such-option", "1", "x.py"], drop=NO_OMP)
    assert result.returncode == 2
    assert result.stderr == ("unirank run: error: unknown option --no-such-option HINT: options "
                             "go before SCRIPT; unirank run --help lists them\n"), result.stderr


PARALLEL_JOB = """
import json, os, sys
import unirank as ur

def body(local_rank):
    print("ENV " + json.dumps({k: v for k, v in os.environ.items() if k in NAMES}), flush=True)
    if os.environ.get("FAIL_RANK") == os.environ["RANK"]:
        raise ValueError("parallel failure")

NAMES = {NAMES}
if __name__ == "__main__":
    with ur.Parallel(backend="auto", nproc_per_node=2) as p:
        p.run(body)
"""
RUN_JOB = """
import json, os
NAMES = {NAMES}
print("ENV " + json.dumps({k: v for k, v in os.environ.items() if k in NAMES}), flush=True)
if os.environ.get("FAIL_RANK") == os.environ["RANK"]:
    raise ValueError("run failure")
"""


#: what ``unirank run`` gives as torchrun does, where ``Parallel`` keeps its own: torchrun's
#: MASTER_ADDR of a one-node rendezvous
RUN_ONLY = {"MASTER_ADDR": ("127.0.0.1", "localhost")}


def _comparable(envs: list[dict[str, str]], tmp: Path, which: int) -> list[dict[str, Any]]:
    """The environments without what differs by nature (``which``: 0 Parallel, 1 run)."""
    out = []
    for env in sorted(envs, key=lambda e: e["RANK"]):
        env = dict(env)
        for name, values in RUN_ONLY.items():
            assert env.pop(name) == values[which]
        assert env.pop("MASTER_PORT").isdigit()
        assert env.pop("TORCHELASTIC_RUN_ID")
        error_file = env.pop("TORCHELASTIC_ERROR_FILE")
        assert error_file.endswith(f"/attempt_0/{env['LOCAL_RANK']}/error.json")
        assert os.path.isabs(error_file)
        out.append(env)
    return out


def test_parallel_workers_see_exactly_what_unirank_run_workers_see(runner: Runner,
                                                                   tmp_path: Path) -> None:
    names = repr(set(NAMES))
    (tmp_path / "par.py").write_text(PARALLEL_JOB.replace("{NAMES}", names))
    (tmp_path / "script.py").write_text(RUN_JOB.replace("{NAMES}", names))
    spawned = subprocess.run([sys.executable, "par.py"], cwd=tmp_path, env=_env(),
                             capture_output=True, text=True, timeout=120,
                             stdin=subprocess.DEVNULL)
    launched = runner.run(["-n", "2", "script.py"], drop=NO_OMP)
    assert spawned.returncode == 0 and launched.returncode == 0, spawned.stderr
    a, b = _envs(spawned.stdout), _envs(launched.stdout)
    assert len(a) == len(b) == 2
    assert _comparable(a, tmp_path, 0) == _comparable(b, tmp_path, 1)
    # a failing rank is reported the same way
    spawned = subprocess.run([sys.executable, "par.py"], cwd=tmp_path,
                             env=_env({"FAIL_RANK": "1"}), capture_output=True, text=True,
                             timeout=120, stdin=subprocess.DEVNULL)
    launched = runner.run(["-n", "2", "script.py"], env={"FAIL_RANK": "1"}, drop=NO_OMP)
    assert launched.returncode == 1
    assert spawned.returncode == 1
    for text, prog, message in ((spawned.stderr, "unirank Parallel", "parallel failure"),
                                (launched.stderr, "unirank run", "run failure")):
        assert f"{prog}: FAILED (exit code 1): rank 1 (local rank 1) on node " in text
        assert f"ValueError: {message}" in text
    assert "WorkerFailedError: local rank 1 (rank 1) exited with code 1: ValueError: " \
           "parallel failure" in spawned.stderr
