"""Every refusal of ``unirank sbatch``: one line on stderr (exact text), exit status 2, nothing
submitted. The ``--submit`` cases put a stand-in ``sbatch`` first on PATH that records being
called, to show that the refusal comes before any submission (no Slurm is needed for that).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from _procs import launcher_free_environ
from unirank.cli.main import main

REPO = Path(__file__).resolve().parents[2]
HELLO = "examples/helloworld.py"
SECRET = "s3cr3t-value-never-shown"

REFUSALS = {
    "nccl_more_ranks_than_gpus": (
        ["-N", "2", "--ntasks-per-node", "4", "--gpus-per-node", "2", "--backend", "nccl", HELLO],
        "4 ranks per node but 2 GPUs per node with nccl: nccl needs one GPU per rank "
        "HINT: give --gpus-per-node 4, or --ntasks-per-node 2, or --backend gloo"),
    "nccl_one_gpu_for_two_ranks": (
        ["--ntasks-per-node", "2", "--gpus-per-node", "1", "--backend", "nccl", HELLO],
        "2 ranks per node but 1 GPU per node with nccl: nccl needs one GPU per rank "
        "HINT: give --gpus-per-node 2, or --ntasks-per-node 1, or --backend gloo"),
    "missing_script": (
        ["missing.py"],
        f"SCRIPT='missing.py': is not a file HINT: give the path of the script from {REPO}, "
        "or -m MODULE for a module"),
    "no_script": (
        ["-N", "2"],
        "no script or module to run HINT: unirank sbatch [options] script.py [args...] or "
        "unirank sbatch [options] -m module [args...]"),
    "bad_time": (
        ["-t", "1h", HELLO],
        "--time='1h': is not a time limit HINT: use MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
        "D-HH:MM:SS (sbatch's formats)"),
    "follow_without_submit": (
        ["--follow", HELLO],
        "--follow needs --submit HINT: add --submit (or drop --follow to print the script)"),
    "parsable_without_submit": (
        ["--parsable", HELLO],
        "--parsable needs --submit HINT: add --submit (or drop --parsable to print the "
        "script)"),
    "dry_run_and_submit": (
        ["--dry-run", "--submit", HELLO],
        "--dry-run and --submit exclude each other HINT: give --dry-run to print the script, "
        "or --submit to submit it"),
    "bad_launch": (
        ["--launch", "nodes", HELLO],
        "--launch='nodes': is not a launch mode HINT: use tasks (one Slurm task per rank "
        "running python SCRIPT) or node (one task per node running unirank run)"),
    "bad_backend": (
        ["--backend", "mpi", HELLO],
        "--backend='mpi': is not a backend unirank sbatch checks HINT: use auto, gloo or nccl"),
    "secret_env_value": (
        ["--env", f"HF_TOKEN={SECRET}", HELLO],
        "--env gives a value for HF_TOKEN, which looks secret: Slurm keeps every batch script, "
        "readable by its admins (scontrol write batch_script) HINT: export HF_TOKEN in this "
        "shell and pass it through with --env HF_TOKEN"),
    "secret_any_case": (
        ["--env", f"my_api_key={SECRET}", HELLO],
        "--env gives a value for my_api_key, which looks secret: Slurm keeps every batch "
        "script, readable by its admins (scontrol write batch_script) HINT: export my_api_key "
        "in this shell and pass it through with --env my_api_key"),
    "secret_in_setup_line": (
        ["--setup", f"export DB_PASSWORD={SECRET}", HELLO],
        "--setup gives a value for DB_PASSWORD, which looks secret: Slurm keeps every batch "
        "script, readable by its admins (scontrol write batch_script) HINT: export "
        "DB_PASSWORD in this shell and pass it through with --env DB_PASSWORD"),
    "secret_in_sbatch_arg": (
        [f"--sbatch-arg=--export=ALL,AWS_SECRET={SECRET}", HELLO],
        "--sbatch-arg gives a value for AWS_SECRET, which looks secret: Slurm keeps every "
        "batch script, readable by its admins (scontrol write batch_script) HINT: export "
        "AWS_SECRET in this shell and pass it through with --env AWS_SECRET"),
    "bad_env_item": (
        ["--env", "1BAD=2", HELLO],
        "--env='1BAD': is not NAME or NAME=VALUE HINT: e.g. --env NCCL_DEBUG=INFO, or --env "
        "HF_TOKEN to pass it from this shell"),
    "bad_signal": (
        ["--signal", "USR9@10", HELLO],
        "--signal='USR9@10': names no signal HINT: name signals a program can catch (not KILL, "
        "STOP or CHLD), by name or number, e.g. USR2@120"),
    "warning_no_rank_stops_on": (
        ["--signal", "HUP@300", HELLO],
        "--signal='HUP@300': HUP cannot be the job's warning: it must reach every rank as a "
        "stop signal that unirank run passes on and its helpers ignore HINT: name one of "
        "USR1, USR2, TERM, e.g. USR2@120"),
    "warning_left_out_of_stop_signals": (
        ["--signal", "USR1@300", "--env", "UNIRANK_STOP_SIGNALS=USR2,TERM", HELLO],
        "UNIRANK_STOP_SIGNALS='USR2,TERM': the ranks' stop signals leave out the job's warning "
        "signal USR1@300, which would end a rank instead of asking it to stop HINT: add USR1 "
        "to --env UNIRANK_STOP_SIGNALS=..., or drop that --env (unirank sbatch exports the "
        "warning then)"),
    "signal_lead_not_below_time": (
        ["--requeue", "-t", "2", HELLO],
        "the warning signal USR2@120 comes 120 s before the time limit, but --time 2 is only "
        "120 s: the job would be warned as it starts HINT: give a longer --time or a shorter "
        "lead, e.g. --signal USR2@30"),
    "zero_nodes": (
        ["--nodes", "0", HELLO],
        "--nodes='0': must be at least 1 HINT: give the number of nodes, N, or an elastic "
        "range MIN:MAX, e.g. 1:2"),
    "range_max_below_min": (
        ["--nnodes", "2:1", HELLO],
        "--nodes='2:1': has MAX below MIN HINT: give the number of nodes, N, or an elastic "
        "range MIN:MAX, e.g. 1:2"),
    "range_with_task_launch": (
        ["--nnodes", "1:2", "--launch", "tasks", HELLO],
        "--nodes='1:2': is an elastic range, which needs --launch node (one unirank run per "
        "node, restarting the ranks at the world left) HINT: drop --launch tasks, or give one "
        "number of nodes, e.g. --nodes 2"),
    "max_restarts_with_task_launch": (
        ["-N", "2", "--max-restarts", "1", "--launch", "tasks", HELLO],
        "--max-restarts='1': needs --launch node (with --launch tasks each rank is a Slurm "
        "task, which no launcher restarts) HINT: add --launch node, or drop --max-restarts"),
    "rdzv_conf_without_range": (
        ["-N", "2", "--launch", "node", "--rdzv-conf", "last_call_timeout=5", HELLO],
        "--rdzv-conf='last_call_timeout=5': needs an elastic range (--nnodes MIN:MAX), whose "
        "nodes meet in torch's c10d rendezvous HINT: give --nnodes MIN:MAX, or drop "
        "--rdzv-conf"),
    "config_unknown_key": (
        ["--config", "CONFIG", HELLO],
        "CONFIG: key='ntasks': is not an option of unirank sbatch HINT: use one of nodes, "
        "ntasks-per-node, gpus-per-node, cpus-per-task, mem, time, partition, account, qos, "
        "job-name, output, error, constraint, requeue, signal, sbatch-arg, env, setup, launch, "
        "max-restarts, rdzv-conf, backend, python, explicit-env"),
    "config_wrong_type": (
        ["--config", "CONFIG_TYPE", HELLO],
        "CONFIG_TYPE: ntasks-per-node='two': must be a whole number HINT: e.g. "
        "ntasks-per-node = ..."),
    "config_not_a_node_count": (
        ["--config", "CONFIG_NODES", HELLO],
        "--nodes='two': is not a number of nodes HINT: give the number of nodes, N, or an "
        "elastic range MIN:MAX, e.g. 1:2"),
}

ARGPARSE_REFUSALS = {
    "unknown_option": (
        ["--nodess", "2", HELLO],
        "unknown option --nodess (did you mean --nodes?) HINT: options go before SCRIPT; "
        "unirank sbatch --help lists them"),
    "no_abbreviations": (
        ["--ntasks", "8", HELLO],
        "unknown option --ntasks (did you mean --ntasks-per-node?) HINT: options go before "
        "SCRIPT; unirank sbatch --help lists them"),
    "sbatch_arg_without_equals": (
        ["--sbatch-arg", "--exclusive", HELLO],
        "argument --sbatch-arg: expected one argument HINT: write the sbatch option after '=': "
        "--sbatch-arg=--exclusive"),
}


def _configs(args: list[str], tmp_path: Path) -> list[str]:
    files = {"CONFIG": "ntasks = 2\n", "CONFIG_TYPE": 'ntasks-per-node = "two"\n',
             "CONFIG_NODES": 'nodes = "two"\n'}
    out = []
    for arg in args:
        if arg in files:
            path = tmp_path / arg
            path.write_text(files[arg])
            arg = str(path)
        out.append(arg)
    return out


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refusal_is_one_exact_line_with_exit_2(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args, message = REFUSALS[case]
    args = _configs(args, tmp_path)
    message = message.replace("CONFIG_TYPE", str(tmp_path / "CONFIG_TYPE")).replace(
        "CONFIG:", f"{tmp_path / 'CONFIG'}:")
    monkeypatch.chdir(REPO)
    assert main(["sbatch", *args]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"unirank sbatch: error: {message}\n"
    assert SECRET not in err


@pytest.mark.parametrize("case", sorted(ARGPARSE_REFUSALS))
def test_argument_refusal_is_one_exact_line_with_exit_2(
    case: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args, message = ARGPARSE_REFUSALS[case]
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as exited:
        main(["sbatch", *args])
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"unirank sbatch: error: {message}\n")


def test_dry_run_never_prints_a_passed_secret(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The secret is in this process's environment; the script names it, never its value."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("UNIRANK_TEST_API_KEY", SECRET)
    assert main(["sbatch", "--env", "UNIRANK_TEST_API_KEY", HELLO]) == 0
    out, err = capsys.readouterr()
    assert "#SBATCH --export=ALL,UNIRANK_TEST_API_KEY\n" in out
    assert SECRET not in out + err


def test_auto_with_fewer_gpus_than_ranks_is_accepted(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--backend auto`` is not refused for 4 ranks on 2 GPUs: the ranks pick gloo there."""
    monkeypatch.chdir(REPO)
    assert main(["sbatch", "--ntasks-per-node", "4", "--gpus-per-node", "2", HELLO]) == 0
    out, err = capsys.readouterr()
    assert "#SBATCH --gpus-per-node=2\n" in out, err


def _unirank(args: list[str], path: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = launcher_free_environ({"PATH": path, "PYTHONPATH": str(REPO / "src")})
    return subprocess.run([sys.executable, "-m", "unirank", "sbatch", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def _recording_sbatch(tmp_path: Path) -> Path:
    """A stand-in sbatch that only records that it was called (it must not be)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sbatch"
    fake.write_text(f"#!/bin/sh\ntouch {tmp_path / 'called'}\necho 1\n")
    fake.chmod(0o755)
    return bin_dir


def test_sbatch_not_on_path(tmp_path: Path) -> None:
    done = _unirank(["--submit", HELLO], str(tmp_path), tmp_path)
    assert done.returncode == 2
    assert done.stderr == (
        "unirank sbatch: error: sbatch is not on PATH: this machine cannot submit to Slurm "
        "HINT: run unirank sbatch on a login node of the cluster, or use --dry-run to print "
        "the script\n")


def test_passed_variable_unset_in_this_shell_is_refused_before_sbatch(tmp_path: Path) -> None:
    bin_dir = _recording_sbatch(tmp_path)
    done = _unirank(["--submit", "--env", "UNIRANK_TEST_UNSET_VAR", HELLO],
                    f"{bin_dir}:/usr/bin:/bin", tmp_path)
    assert done.returncode == 2
    assert done.stderr == (
        "unirank sbatch: error: --env UNIRANK_TEST_UNSET_VAR passes a variable that is not set "
        "in this shell HINT: export UNIRANK_TEST_UNSET_VAR before submitting, or drop --env "
        "UNIRANK_TEST_UNSET_VAR\n")
    assert not (tmp_path / "called").exists()


def test_refusals_with_submit_never_call_sbatch(tmp_path: Path) -> None:
    bin_dir = _recording_sbatch(tmp_path)
    for args in (["--submit", "missing.py"], ["--submit", "-t", "1h", HELLO],
                 ["--submit", "--launch", "nodes", HELLO],
                 ["--submit", "--env", f"HF_TOKEN={SECRET}", HELLO]):
        done = _unirank(args, f"{bin_dir}:/usr/bin:/bin", tmp_path)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, (args, done.stderr)
        assert SECRET not in done.stdout + done.stderr
    assert not (tmp_path / "called").exists()


def test_submit_sends_the_rendered_script_and_prints_the_job_id(tmp_path: Path) -> None:
    """A stand-in sbatch keeps what it got on stdin and answers as ``sbatch --parsable``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sbatch"
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "args"}\ncat > {tmp_path / "stdin"}\n'
                    'echo "77;testbed"\n')
    fake.chmod(0o755)
    path = f"{bin_dir}:/usr/bin:/bin"
    dry = _unirank(["-N", "2", HELLO], path, tmp_path)
    parsable = _unirank(["-N", "2", "--submit", "--parsable", HELLO], path, tmp_path)
    assert (parsable.returncode, parsable.stdout) == (0, "77;testbed\n")
    assert (tmp_path / "args").read_text() == "--parsable\n"
    assert (tmp_path / "stdin").read_text() == dry.stdout
    plain = _unirank(["-N", "2", "--submit", HELLO], path, tmp_path)
    assert (plain.returncode, plain.stdout) == (0, "Submitted batch job 77\n")
