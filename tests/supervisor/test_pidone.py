"""The init's decisions when ``unirank run`` is PID 1 (tests/integration/test_pid1.py runs the
real thing in a PID namespace)."""

from __future__ import annotations

import os
import signal

from unirank.supervisor.pidone import classify, exit_code, forward, is_init, stand_in_for_init


def _exited(code: int) -> int:
    return (code & 0xFF) << 8


def test_only_pid_1_is_the_init() -> None:
    assert is_init(1)
    assert not is_init(2) and not is_init(os.getpid() if os.getpid() != 1 else 2)


def test_elsewhere_it_returns_at_once() -> None:
    parent = os.getpid()
    stand_in_for_init(pid=2)
    assert os.getpid() == parent  # no fork happened


def test_exit_code_is_the_shell_s() -> None:
    assert exit_code(_exited(0)) == 0
    assert exit_code(_exited(143)) == 143
    assert exit_code(int(signal.SIGKILL)) == 137  # died by signal 9
    assert exit_code(int(signal.SIGTERM)) == 143


def test_forwards_what_a_runtime_sends_but_not_sigchld() -> None:
    arrived = [int(signal.SIGCHLD), int(signal.SIGTERM), int(signal.SIGCHLD),
               int(signal.SIGINT), int(signal.SIGUSR1)]
    assert forward(arrived) == [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1]
    assert forward(bytes([signal.SIGCHLD])) == []


def test_classify_tells_the_supervisor_from_orphans() -> None:
    assert classify([], main=40) == (None, 0)
    assert classify([(41, _exited(0)), (42, _exited(1))], main=40) == (None, 2)
    assert classify([(41, _exited(0)), (40, _exited(143))], main=40) == (143, 1)
