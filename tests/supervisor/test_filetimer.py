"""torchelastic's file-based watchdog (unirank.supervisor.filetimer): the pure decisions on
torch's request lines, and a real worker that stays in ``timer.expires(after=1)`` killed by
``unirank run`` as torchrun's agent kills it. Checked by hand with torchrun 2.13 on the same
script: the run ends with exit code 137 too, though there torchrun's own process dies by SIGKILL
with the worker, without a failure report; unirank run reports the killed rank."""

from __future__ import annotations

import json
import signal

import pytest

from _procs import Runner
from unirank.supervisor.filetimer import Timers, timer_file


def _line(pid: int, scope: str, deadline: float, sig: int = 9) -> str:
    return json.dumps({"version": 1, "pid": pid, "scope_id": scope,
                       "expiration_time": deadline, "signal": sig})


def test_a_scope_past_its_deadline_gets_its_signal_once() -> None:
    timers = Timers()
    timers.take(_line(10, "a", 100.0))
    timers.take(_line(11, "b", 200.0, sig=int(signal.SIGTERM)))
    assert timers.expired(99.0) == {}
    assert timers.expired(150.0) == {10: signal.SIGKILL}
    assert timers.expired(150.0) == {}
    assert timers.expired(250.0) == {11: signal.SIGTERM}


def test_a_release_a_zero_signal_and_garbage_signal_nothing() -> None:
    timers = Timers()
    timers.take(_line(10, "a", 100.0))
    timers.take(_line(10, "a", -1.0, sig=0))  # FileTimerClient.release
    timers.take(_line(12, "c", 100.0, sig=0))
    timers.take("not json")
    timers.take(json.dumps({"pid": 1}))
    assert timers.expired(1000.0) == {}


def test_the_earliest_expired_scope_s_signal_wins() -> None:
    timers = Timers()
    timers.take(_line(10, "late", 50.0, sig=int(signal.SIGTERM)))
    timers.take(_line(10, "early", 40.0, sig=int(signal.SIGKILL)))
    assert timers.expired(60.0) == {10: signal.SIGKILL}


def test_the_pipe_is_asked_for_by_torchrun_s_variables() -> None:
    assert timer_file({}) is None
    assert timer_file({"TORCHELASTIC_TIMER_FILE": "/tmp/x"}) is None
    assert timer_file({"TORCHELASTIC_ENABLE_FILE_TIMER": "1",
                       "TORCHELASTIC_TIMER_FILE": "/tmp/x"}) == "/tmp/x"
    path = timer_file({"TORCHELASTIC_ENABLE_FILE_TIMER": "1"})
    assert path is not None and "watchdog_timer_" in path


EXPIRES = """
import os, time
import torch.distributed.elastic.timer as timer
timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
print("in", flush=True)
with timer.expires(after=1):
    time.sleep(120)
print("not killed", flush=True)
"""


@pytest.mark.integration
def test_a_worker_past_its_deadline_is_killed(runner: Runner) -> None:
    runner.script("expires.py", EXPIRES)
    result = runner.run(["-n", "1", "expires.py"], env={"TORCHELASTIC_ENABLE_FILE_TIMER": "1"})
    assert result.returncode == 128 + signal.SIGKILL, result.stderr
    assert result.stdout == "in\n"
    assert "killed by SIGKILL" in result.stderr
