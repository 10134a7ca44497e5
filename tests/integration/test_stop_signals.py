"""Every stop signal stops (torchrun's SIGTERM, SIGINT, SIGHUP and SIGQUIT alike): a real
``unirank run -n 2 --max-restarts 3``, SIGHUP or SIGQUIT to the launcher (a closed terminal, a
Ctrl-\\): the workers get it and are not started again, whatever ``--max-restarts`` is left, the
launcher ends with 128 + the signal and nothing of the run is left running."""

from __future__ import annotations

import signal

import pytest

from _procs import Runner, process_tree

#: a rank that says it started, then waits in a collective-free sleep for its stop
WAITS = """\
import os, time
import torch.distributed as dist
dist.init_process_group("gloo")
print("READY", os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"], flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGQUIT])
def test_sighup_and_sigquit_stop_the_run_without_a_restart(runner: Runner,
                                                           signum: signal.Signals) -> None:
    script = runner.script("w.py", WAITS)
    proc = runner.start(["--nproc-per-node", "2", "--max-restarts", "3", str(script)])
    assert proc.stdout is not None and proc.stderr is not None
    runner.read_lines(proc.stdout, 2, contains="READY")
    tree = process_tree(proc.pid)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=runner.timeout)
    text = err.decode()
    assert proc.returncode == 128 + signum, text
    assert "restarting the workers" not in text, text
    assert f"got {signum.name}: forwarded to the workers" in text, text
    assert f"stopped by {signum.name} (exit code {128 + signum})" in text, text
    assert "READY" not in out.decode(), out  # started once: no READY after the first two
    assert runner.wait_gone(tree, mark=b"") == [], tree


def test_a_worker_ended_by_a_forwarded_signal_is_stopped_not_failed(runner: Runner) -> None:
    """SIGUSR1 (forwarded, not a stop signal) to workers that do not handle it: they die of
    it, which is a stop, not a failure: no restart, 128 + SIGUSR1, nothing left."""
    script = runner.script("w.py", WAITS)
    proc = runner.start(["--nproc-per-node", "2", "--max-restarts", "3", str(script)])
    assert proc.stdout is not None and proc.stderr is not None
    runner.read_lines(proc.stdout, 2, contains="READY")
    tree = process_tree(proc.pid)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=runner.timeout)
    text = err.decode()
    assert proc.returncode == 128 + signal.SIGUSR1, text
    assert "restarting the workers" not in text and "FAILED" not in text, text
    assert "forwarded to it by the launcher (its program does not handle it)" in text, text
    assert f"stopped by SIGUSR1 (exit code {128 + signal.SIGUSR1})" in text, text
    assert "READY" not in out.decode(), out
    assert runner.wait_gone(tree, mark=b"") == [], tree


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_while_a_node_waits_for_its_first_round_says_so_and_ends(
        runner: Runner, signum: signal.Signals) -> None:
    """``--nnodes 2`` with one node started: it waits for the other (no worker runs); a stop
    signal ends the wait with one line and 128 + the signal (it died of it, silently, before),
    and nothing of the run is left running."""
    from _procs import free_port, wait_listening

    script = runner.script("w.py", WAITS)
    port = free_port()
    proc = runner.start(["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                         "--rdzv-endpoint", f"127.0.0.1:{port}", str(script)])
    wait_listening(port, proc, runner.timeout)  # the rendezvous is served: the node waits
    tree = process_tree(proc.pid)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=runner.timeout)
    text = err.decode()
    assert proc.returncode == 128 + signum, text
    assert f"unirank run: got {signum.name} while waiting for a rendezvous round: stopped (no " \
        "worker was running)" in text, text
    assert "Traceback" not in text and "READY" not in out.decode(), text
    assert runner.wait_gone(tree, mark=b"") == [], tree
