"""``unirank run``'s host-list options refused in one line before anything starts (no ssh
needed: every case here is refused before the pre-flight), and the arguments each host's
``unirank run`` gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from _procs import Runner, refusal_line
from unirank.cli.main import build_parser
from unirank.cli.sshrun import SSH_OPTIONS, _user_arguments

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = str(REPO / "examples" / "quickstart.py")


@pytest.mark.parametrize(("args", "says"), [
    (["--hosts", "a:2", "--nnodes", "2"], "--nnodes='2': is set by the host list"),
    (["--hosts", "a:2", "--standalone"], "--standalone='True': is set by the host list"),
    (["--include", "a"], "--include='a': only applies with --hosts or --hostfile"),
    (["-x", "HOME"], "-x='HOME': only applies with --hosts or --hostfile"),
    (["--hosts", "a:2,b:4"], "gives the hosts different slot counts"),
    (["--hosts", "a:2", "--hostfile", "f"], "--hosts='a:2': cannot be combined with --hostfile"),
    (["--hostfile", "/no/such/file"], "--hostfile='/no/such/file': cannot be read"),
    (["--hosts", "a:2,b:2", "--exclude", "a@b"], "--exclude='a@b': leaves no host"),
    (["--hosts", "a:2", "-x", "UNIRANK_TEST_SURELY_UNSET"], "names a variable that is not set"),
])
def test_host_options_are_refused_in_one_line(args: list[str], says: str,
                                              runner: Runner) -> None:
    done = runner.run([*args, QUICKSTART], timeout=60)
    assert says in refusal_line(done)
    assert done.stdout == ""


def test_each_host_gets_the_users_options_without_the_host_list_ones() -> None:
    argv = ["run", "--hosts", "a:2,b:2", "--tag-output", "--ssh-option", "-F cfg", "-x", "FOO",
            "--include=a@b", "--max-restarts", "1", "train.py", "-x", "--hosts"]
    parser = build_parser("run")
    args, _ = parser.parse_known_args(argv)
    args.raw_argv = argv[1:]
    assert _user_arguments(args) == ["--tag-output", "--max-restarts", "1", "train.py", "-x",
                                     "--hosts"]
    assert set(SSH_OPTIONS) <= set(args.value_options)


def test_a_host_list_with_a_range_is_an_elastic_job_of_the_dynamic_rendezvous() -> None:
    from unirank.cli.sshrun import _elastic_options, check_ssh_only, elastic

    parser = build_parser("run")
    args, _ = parser.parse_known_args(["run", "--hosts", "a:2,b:2", "--nnodes", "1:2",
                                       "train.py"])
    check_ssh_only(args)  # a range is accepted: not refused as "set by the host list"
    assert elastic(args)
    assert _elastic_options(args, "10.0.0.1", 4242) == [
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:4242"]
    args, _ = parser.parse_known_args(["run", "--hosts", "a:2", "--nnodes", "1:2",
                                       "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1",
                                       "train.py"])
    assert _elastic_options(args, "10.0.0.1", 4242) == []
    args, _ = parser.parse_known_args(["run", "--hosts", "a:2", "--nnodes", "2", "train.py"])
    assert not elastic(args)
