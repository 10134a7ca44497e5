"""``unirank sbatch --dry-run``: the rendered script of each layout against its golden file, and
the pure pieces (time and signal formats, --env, config merge) it is built from.

Regenerate the golden files with ``UNIRANK_REGEN_JOBSCRIPTS=1`` (see tests/fixtures/jobscripts).
The scripts name the interpreter that runs unirank sbatch (``sys.executable``); the golden files
hold :data:`PYTHON` in its place.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from _procs import read_stdout_until
from unirank.cli.main import main
from unirank.errors import ConfigError
from unirank.exitcodes import REQUEUE as REQUEUE_EXIT_CODE
from unirank.sbatch.config import merge, validate_config
from unirank.sbatch.script import render
from unirank.sbatch.spec import (
    JobSpec,
    check_spec,
    parse_env,
    parse_nodes,
    parse_time,
    parse_warning_signal,
)

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "fixtures" / "jobscripts"
REGEN = os.environ.get("UNIRANK_REGEN_JOBSCRIPTS", "") not in ("", "0")
#: stands for this machine's interpreter in the golden files
PYTHON = "/home/me/venv/bin/python"

LAYOUTS = {
    "tasks_2x2_gloo.sh": ["-N", "2", "--ntasks-per-node", "2", "--backend", "gloo",
                          "--launch", "tasks", "examples/helloworld.py", "--backend", "gloo"],
    # every default: a plain torchrun script runs (one unirank run per node)
    "default_2x2.sh": ["-N", "2", "--ntasks-per-node", "2", "examples/train.py"],
    "node_2x4_nccl_requeue.sh": [
        "--nodes", "2", "--ntasks-per-node", "4", "--gpus-per-node", "4", "-c", "8",
        "--mem", "200G", "-t", "12:00:00", "-p", "gpu", "-A", "proj42", "-q", "high",
        "-J", "train", "-o", "logs/%x-%j.out", "-C", "a100", "--launch", "node",
        "--backend", "nccl", "--requeue", "--setup", "module load cuda/12.4",
        "--setup", "source ~/venv/bin/activate", "--env", "NCCL_DEBUG=INFO",
        "--env", "WANDB_API_KEY", "--sbatch-arg=--exclusive", "--",
        "examples/train.py", "--epochs", "10", "--checkpoint", "ckpt/model.pt",
    ],
    "explicit_env.sh": ["-N", "2", "--ntasks-per-node", "2", "--explicit-env", "--launch",
                        "tasks", "--python", "/opt/venv/bin/python", "-m", "pkg.train", "--lr",
                        "0.1"],
    "config_merge.sh": ["--config", "tests/fixtures/jobscripts/job.toml", "--nodes", "2",
                        "-t", "2:00:00", "--env", "NCCL_DEBUG=INFO", "--setup",
                        "source ~/venv/bin/activate", "--signal", "USR1@300",
                        "--launch", "tasks", "examples/train.py"],
    "batch_signal_requeue.sh": ["-N", "2", "--requeue", "--signal", "B:USR2@120",
                                "--launch", "tasks", "examples/train.py", "--checkpoint",
                                "ckpt/model.pt"],
    "elastic_1to2.sh": ["--nnodes", "1:2", "--ntasks-per-node", "2", "--rdzv-conf",
                        "last_call_timeout=5", "examples/train.py", "--epochs", "3"],
    "elastic_requeue_signal.sh": ["-N", "2-4", "--ntasks-per-node", "4", "--gpus-per-node", "4",
                                  "-c", "8", "--max-restarts", "5", "--requeue", "--signal",
                                  "B:USR2@120", "examples/train.py"],
}


def dry_run(args: list[str], capsys: pytest.CaptureFixture[str],
            monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(REPO)
    code = main(["sbatch", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out.replace(shlex.quote(sys.executable), PYTHON)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_rendered_script_matches_golden_file(
    name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = dry_run(LAYOUTS[name], capsys, monkeypatch)
    path = GOLDEN / name
    if REGEN:
        path.write_text(script)
    assert script == path.read_text(), f"{name} differs; see tests/fixtures/jobscripts/README.md"


def test_golden_scripts_are_valid_bash() -> None:
    for name in LAYOUTS:
        checked = subprocess.run(["bash", "-n", str(GOLDEN / name)], capture_output=True,
                                 text=True, timeout=30)
        assert checked.returncode == 0, f"{name}: {checked.stderr}"


def test_tasks_layout_is_one_srun_task_per_rank(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = dry_run(LAYOUTS["tasks_2x2_gloo.sh"], capsys, monkeypatch)
    assert "#SBATCH --ntasks-per-node=2\n" in script
    assert f"\nsrun --quiet {PYTHON} examples/helloworld.py --backend gloo\nstatus=$?\n" in script
    assert "MASTER_ADDR=" not in script and "MASTER_PORT=" not in script
    assert "--requeue" not in script and "--signal" not in script


def test_the_default_launch_gives_every_rank_torchrun_s_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: with every default, a plain torchrun script (``dist.init_process_group()``,
    no unirank import) needs RANK, WORLD_SIZE, MASTER_ADDR... in its environment: the default
    is one ``unirank run`` per node, whose workers get them, not ``srun python SCRIPT``."""
    script = dry_run(LAYOUTS["default_2x2.sh"], capsys, monkeypatch)
    assert "#SBATCH --ntasks-per-node=1\n" in script
    assert f"\nsrun --quiet {PYTHON} -m unirank run --nproc-per-node 2 examples/train.py\n" \
        in script


def test_node_layout_runs_unirank_run_per_node_with_the_cpus_of_its_ranks(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = dry_run(LAYOUTS["node_2x4_nccl_requeue.sh"], capsys, monkeypatch)
    assert "#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=32\n" in script
    assert "export OMP_NUM_THREADS=8\n" in script
    assert f"\nsrun --quiet {PYTHON} -m unirank run --nproc-per-node 4 examples/train.py" in script
    for line in ("#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --signal=USR2@120",
                 "#SBATCH --export=ALL,WANDB_API_KEY", "#SBATCH --exclusive",
                 f'if [ "$status" -eq {REQUEUE_EXIT_CODE} ] && [ -z "$ended" ]; then'):
        assert line + "\n" in script, line


def test_the_job_runs_the_interpreter_that_ran_unirank_sbatch(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """Not whatever ``python`` the job's PATH finds first: this interpreter's absolute path,
    unless --python (or the config file's python key) names another."""
    monkeypatch.chdir(REPO)
    assert main(["sbatch", "examples/helloworld.py"]) == 0
    script = capsys.readouterr().out
    run = "-m unirank run --nproc-per-node 1 examples/helloworld.py"
    assert f"\nsrun --quiet {shlex.quote(sys.executable)} {run}\n" in script
    assert os.path.isabs(sys.executable)
    script = dry_run(["--python", "python3.12", "examples/helloworld.py"], capsys, monkeypatch)
    assert f"\nsrun --quiet python3.12 {run}\n" in script
    config = tmp_path / "job.toml"
    config.write_text('python = "/opt/env/bin/python"\n')
    script = dry_run(["--config", str(config), "--launch", "tasks", "examples/helloworld.py"],
                     capsys, monkeypatch)
    assert "\nsrun --quiet /opt/env/bin/python examples/helloworld.py\n" in script


def test_golden_files_hold_no_machine_interpreter() -> None:
    for name in LAYOUTS:
        assert sys.executable not in (GOLDEN / name).read_text(), name


#: a stand-in srun: says READY, waits up to 60 s for SIGUSR2 or SIGTERM (blocked, then
#: sigtimedwait: no handler), says which came and exits 79, as ranks that saved and stopped do
FAKE_SRUN = f"""#!{sys.executable}
import signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGUSR2, signal.SIGTERM}})
print("READY", flush=True)
got = signal.sigtimedwait({{signal.SIGUSR2, signal.SIGTERM}}, 60)
if got is None:
    sys.exit("srun got no signal in 60 s")
print("srun got", signal.Signals(got.si_signo).name, flush=True)
sys.exit({REQUEUE_EXIT_CODE})
"""


def _run_script(script: str, tmp_path: Path, signals: list[str]) -> tuple[int, str]:
    """Run a rendered batch script with stand-ins for srun and scontrol; once srun says READY,
    send ``signals`` to the batch shell (``TERM``: to its children as well, srun and the
    poll's sleep, after the shell, as Slurm's step daemon walks the batch step's processes;
    sent the other way round, a stand-in srun that exits at once could end before the shell
    knows of the signal, which ranks that save a checkpoint first never do). The script's
    exit status and output."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "scontrol").write_text('#!/bin/sh\necho "scontrol $*"\n')
    for name in ("srun", "scontrol"):
        (bin_dir / name).chmod(0o755)
    (tmp_path / "job.sh").write_text(script)
    env = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin", "SLURM_JOB_ID": "42"}
    proc = subprocess.Popen(["bash", str(tmp_path / "job.sh")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        seen = read_stdout_until(proc, lambda out: b"READY\n" in out, 60, "srun's READY")
        children = [int(pid) for pid in subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True,
            timeout=30).stdout.split()]  # srun, and the poll's sleep
        for name in signals:
            os.kill(proc.pid, signal.Signals["SIG" + name])
            if name == "TERM":  # as Slurm: to every process of the job
                for child in children:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child, signal.SIGTERM)
        rest, _ = proc.communicate(timeout=90)  # the stand-in gives up after 60 s
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    out = (seen + rest).decode().split("READY\n", 1)[1]  # what came after the start
    return proc.returncode, out


def test_batch_signal_is_passed_to_srun_and_the_step_s_79_requeues(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """``--signal B:USR2``: the batch shell gets SIGUSR2; its trap passes it to srun and waits
    for srun again (a trap ends ``wait`` early); srun's 79 then requeues the job."""
    script = dry_run(LAYOUTS["batch_signal_requeue.sh"], capsys, monkeypatch)
    code, out = _run_script(script, tmp_path, ["USR2"])
    assert code == REQUEUE_EXIT_CODE, out
    assert out.splitlines() == [
        "srun got SIGUSR2",
        "unirank sbatch: stopped to be requeued (exit code 79); requeueing job 42",
        "scontrol requeue 42"], out


@pytest.mark.parametrize("attempt", range(8))
def test_after_slurm_s_sigterm_the_batch_shell_waits_and_does_not_requeue(
    tmp_path: Path, attempt: int,
) -> None:
    """scancel, ``scontrol requeue`` and preemption send SIGTERM to the batch shell and the
    ranks: the shell outlives it, waits for the ranks' exit (79 after saving) and leaves the
    requeue to Slurm: a cancelled job is not requeued by the script. Run many times: srun
    ending while the shell's trap runs must not lose its status (a trap that ends bash's
    ``wait`` early can, one run in ten here)."""
    script = render(check_spec(JobSpec(program="train.py", nodes=2, tasks_per_node=2,
                                       launch="node", requeue=True)))
    code, out = _run_script(script, tmp_path, ["TERM"])
    assert code == REQUEUE_EXIT_CODE, out
    assert out.splitlines() == ["srun got SIGTERM"], out


def test_setup_lines_come_in_order_before_the_launch(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = dry_run(LAYOUTS["node_2x4_nccl_requeue.sh"], capsys, monkeypatch)
    load, activate = script.index("module load cuda/12.4"), script.index("source ~/venv")
    assert load < activate < script.index("\nsrun ")


def test_config_file_is_under_the_flags(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = dry_run(LAYOUTS["config_merge.sh"], capsys, monkeypatch)
    assert "#SBATCH --nodes=2\n" in script  # flag over the file's 4
    assert "#SBATCH --time=2:00:00\n" in script
    assert "#SBATCH --partition=gpu\n#SBATCH --account=proj42\n" in script  # from the file
    assert "#SBATCH --signal=USR1@300\n" in script
    # the warning is one of the ranks' stop signals (issue 33: it was USR2,TERM, and USR1
    # killed every rank without a handler)
    assert "\nexport UNIRANK_STOP_SIGNALS=USR1,TERM\n" in script
    assert "export NCCL_DEBUG=INFO\n" in script and "NCCL_DEBUG=WARN" not in script
    assert "#SBATCH --export=ALL,HF_TOKEN\n" in script
    assert script.index("module load cuda/12.4") < script.index("source ~/venv/bin/activate")


@pytest.mark.parametrize("text,seconds", [
    ("30", 1800), ("0", 0), ("5:30", 330), ("1:02:03", 3723), ("2-12", 216000),
    ("1-01:30", 91800), ("1-00:00:10", 86410),
])
def test_sbatch_time_formats(text: str, seconds: int) -> None:
    assert parse_time(text) == seconds


@pytest.mark.parametrize("text", ["1h", "1:2:3:4", "-5", "1-", "", "1.5"])
def test_bad_time_formats_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="is not a time limit"):
        parse_time(text)


@pytest.mark.parametrize("text,lead", [
    ("USR2@120", 120), ("B:TERM", 60), ("SIGUSR1@90", 90), ("R:10@5", 5), ("RB:USR2", 60),
])
def test_sbatch_signal_syntax(text: str, lead: int) -> None:
    assert parse_warning_signal(text) == (text, lead)


@pytest.mark.parametrize(("args", "exported"), [
    (["--signal", "USR1@300"], "USR1,TERM"),
    (["--signal", "B:SIGUSR1@300", "--requeue"], "USR1,TERM"),
    (["--signal", "R:10@5"], "USR1,TERM"),
    (["--requeue"], None),  # USR2@120: among the ranks' default stop signals
    (["--signal", "USR2@60"], None),
    (["--signal", "TERM@60"], None),
    ([], None),  # no warning at all
    (["--signal", "USR1@300", "--env", "UNIRANK_STOP_SIGNALS=USR1,HUP"], None),  # the user's
    (["--signal", "USR1@300", "--env", "UNIRANK_STOP_SIGNALS"], None),  # passed by name
])
def test_the_warning_is_always_one_of_the_ranks_stop_signals(
        args: list[str], exported: str | None, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIRANK_STOP_SIGNALS", "USR1,TERM")  # for the name passed through
    script = dry_run(["-N", "1", *args, "examples/train.py"], capsys, monkeypatch)
    lines = [line for line in script.splitlines() if "UNIRANK_STOP_SIGNALS=" in line]
    assert lines == ([f"export UNIRANK_STOP_SIGNALS={exported}"] if exported else
                     [line for line in lines if "USR1,HUP" in line])


def test_env_items_pass_names_and_later_items_win() -> None:
    assert parse_env(("A=1", "HF_TOKEN", "A=2", "B=")) == (("HF_TOKEN", None), ("A", "2"),
                                                          ("B", ""))


def test_merge_adds_lists_and_lets_flags_win() -> None:
    file = validate_config({"nodes": 4, "setup": ["a"], "sbatch_args": ["--x"], "time": 30},
                           "job.toml")
    merged = merge(file, {"nodes": 2, "setup": ("b",), "sbatch_args": None, "qos": None})
    assert merged == {"nodes": 2, "setup": ("a", "b"), "sbatch_args": ("--x",), "time": "30"}


def test_render_is_pure() -> None:
    spec = check_spec(JobSpec(program="train.py", nodes=3, tasks_per_node=2, requeue=True))
    assert render(spec) == render(spec)
    assert "#SBATCH --job-name=train\n" in render(spec)


def test_docs_show_the_recorded_script() -> None:
    """docs/slurm-jobs.md shows the golden node-launch script verbatim."""
    doc = (REPO / "docs" / "slurm-jobs.md").read_text()
    marker = "<!-- golden: node_2x4_nccl_requeue.sh -->\n```bash\n"
    start = doc.index(marker) + len(marker)
    shown = doc[start:doc.index("```\n", start)]
    assert shown == (GOLDEN / "node_2x4_nccl_requeue.sh").read_text()


def test_an_elastic_range_asks_min_to_max_nodes_and_no_tasks_per_node(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slurm 22.05 gives ``--nodes=1-2 --ntasks-per-node=1`` one node (it counts MIN tasks),
    ``--nodes=1-2`` alone two: the script asks no tasks per node, and --no-kill."""
    script = dry_run(LAYOUTS["elastic_1to2.sh"], capsys, monkeypatch)
    assert "#SBATCH --nodes=1-2\n" in script
    assert "#SBATCH --ntasks-per-node" not in script
    assert "#SBATCH --no-kill\n" in script
    assert " --max-restarts 3 --nnodes 1:2 --rdzv-backend c10d --rdzv-conf last_call_timeout=5 "\
        in script
    assert '--rdzv-id "$SLURM_JOB_ID"' in script


@pytest.mark.parametrize("nodes", [["-N", "1-2"], ["--nodes", "1:2"], ["--nnodes", "1-2"]])
def test_every_spelling_of_a_range_gives_the_same_script(
    nodes: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = LAYOUTS["elastic_1to2.sh"]
    assert dry_run([*nodes, *args[2:]], capsys, monkeypatch) == \
        dry_run(args, capsys, monkeypatch)


def test_a_range_of_one_count_is_no_elastic_job() -> None:
    spec = check_spec(JobSpec(program="x.py", nodes=2, min_nodes=None, launch="node"))
    assert not spec.elastic
    assert render(spec) == render(check_spec(JobSpec(program="x.py", nodes=2, launch="node")))
    assert parse_nodes("2:2") == (2, None)
    assert parse_nodes("1-4") == (4, 1)


def test_node_launch_carries_max_restarts(capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    script = dry_run(["-N", "2", "--launch", "node", "--max-restarts", "2",
                      "examples/helloworld.py"], capsys, monkeypatch)
    assert (f"\nsrun --quiet {PYTHON} -m unirank run --nproc-per-node 1 --max-restarts 2 "
            "examples/helloworld.py\n") in script
