"""What ``unirank run --hosts`` sends over ssh (pure parts), and the remote side's stdin: the
carried environment, the ssh command, the quoted remote line, the stripped options, and the
stdin watch (in a real child process)."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys

import pytest

from unirank.errors import ConfigError
from unirank.supervisor.ssh.remote import (
    carried_environ,
    decode_environ,
    encode_environ,
    remote_line,
    ssh_command,
    ssh_options,
    strip_options,
)

ENVIRON = {"NCCL_DEBUG": "INFO", "GLOO_SOCKET_IFNAME": "eth0", "TORCH_SHOW_CPP_STACKTRACES": "1",
           "CUDA_LAUNCH_BLOCKING": "1", "PYTHONPATH": "/src", "OMP_NUM_THREADS": "4",
           "UNIRANK_INIT_TIMEOUT": "60", "HOME": "/root", "SLURM_JOB_ID": "7",
           "TORCHELASTIC_RUN_ID": "x", "MASTER_ADDR": "here", "MY_TOKEN": "s3cret",
           "UNIRANK_NODE_NAME": "this-host"}


def test_carried_variables_are_the_prefixes_the_names_and_the_x_ones() -> None:
    assert carried_environ(ENVIRON, ["MY_TOKEN"]) == {
        "NCCL_DEBUG": "INFO", "GLOO_SOCKET_IFNAME": "eth0", "TORCH_SHOW_CPP_STACKTRACES": "1",
        "CUDA_LAUNCH_BLOCKING": "1", "PYTHONPATH": "/src", "OMP_NUM_THREADS": "4",
        "UNIRANK_INIT_TIMEOUT": "60", "MY_TOKEN": "s3cret"}


def test_an_x_name_may_give_its_value_as_mpiruns() -> None:
    assert carried_environ({}, ["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}


def test_an_x_name_that_is_not_set_is_refused() -> None:
    with pytest.raises(ConfigError, match="-x='NOPE': names a variable that is not set here"):
        carried_environ(ENVIRON, ["NOPE"])


def test_the_environment_travels_as_one_json_line_without_pythonpath() -> None:
    line = encode_environ({"PYTHONPATH": "/src", "B": "two\nlines", "A": "x"})
    assert line.count(b"\n") == 1 and line.endswith(b"\n")
    assert decode_environ(line.rstrip(b"\n")) == {"A": "x", "B": "two\nlines"}
    for bad in (b"", b"[1]", b'{"A": 1}', b"\xff"):
        with pytest.raises(ConfigError, match="--from-ssh"):
            decode_environ(bad)


def test_ssh_options_and_the_command() -> None:
    options = ssh_options(["Port=2222", "-F '/my dir/config'", " "])
    assert options == ["-o", "Port=2222", "-F", "/my dir/config"]
    assert ssh_command("node1", options, "true", connect_timeout=3) == [
        "ssh", "-o", "Port=2222", "-F", "/my dir/config", "-T", "-o", "BatchMode=yes",
        "-o", "ConnectTimeout=3", "--", "node1", "true"]


def test_the_remote_line_quotes_every_value_and_shows_no_variable_but_pythonpath() -> None:
    carried = {"PYTHONPATH": "/a b", "MY_TOKEN": "s3cret"}
    line = remote_line("/work/it's here", ["/py thon", "-m", "unirank", "run", "a;b"], carried)
    assert "s3cret" not in line
    cd, _and, rest = line.partition(" && ")
    assert shlex.split(cd) == ["cd", "--", "/work/it's here"]
    assert shlex.split(rest) == ["exec", "env", "PYTHONPATH=/a b", "/py thon", "-m", "unirank",
                                 "run", "a;b"]
    done = subprocess.run(["sh", "-c", remote_line("/", ["echo", "$HOME", "a;b"], {})],
                          capture_output=True, text=True, check=True, timeout=30)
    assert done.stdout == "$HOME a;b\n"


def test_strip_options_drops_the_ssh_ones_before_the_program_only() -> None:
    raw = ["--hosts", "a:2,b:2", "--tag-output", "--ssh-option=-F x", "-x", "FOO", "-xBAR",
           "-n", "2", "--include", "a", "train.py", "--hosts", "kept", "-x", "kept"]
    stripped = strip_options(raw, ["--hosts", "--ssh-option", "-x", "--include"],
                             ["--hosts", "--ssh-option", "-x", "--include", "-n"])
    assert stripped == ["--tag-output", "-n", "2", "train.py", "--hosts", "kept", "-x", "kept"]


_CHILD = """
import json, os, signal, sys
from unirank.supervisor.ssh.stdinwatch import take_environ, watch_stdin
environ, fd = take_environ(timeout=30)
print(json.dumps(environ), sys.stdin.read() == "", flush=True)  # fd 0 is /dev/null now
watch_stdin(fd)
signal.pause()
"""


def test_the_remote_side_takes_its_environment_then_ends_when_stdin_closes() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(encode_environ({"NCCL_X": "1"}).decode())
    proc.stdin.flush()
    assert proc.stdout.readline() == json.dumps({"NCCL_X": "1"}) + " True\n"
    proc.stdin.close()
    assert proc.wait(timeout=30) == -signal.SIGTERM


def test_the_verdict_line_says_failed_and_lost_peer() -> None:
    from unirank.supervisor.ssh.remote import parse_verdict, verdict_line

    lost = verdict_line(True, True)
    assert lost.endswith("\n") and lost.count("\n") == 1
    assert parse_verdict(lost.strip().encode()) == (True, True)
    assert parse_verdict(verdict_line(True, False).strip().encode()) == (True, False)
    assert parse_verdict(verdict_line(False, True).strip().encode()) == (False, False)
    assert parse_verdict(b"hello") is None
    assert parse_verdict(b"UNIRANK-HOST-VERDICT [") is None
