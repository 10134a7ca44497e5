"""A :class:`~unirank.supervisor.engine.Supervisor` built here, running real tiny child
processes (``python -c``, no torch, no bootstrap), so that the engine's mechanism is checked
on its own: it carries out the stop policy's decisions (SIGTERM to the others on a failure,
SIGKILL after the grace period, a stop signal forwarded, a second one killing at once, a
change of the world), blames the root cause and leaves no process behind.

The children meet through a FIFO where an order matters (opening it blocks until the other
side opens it); every child arms ``signal.alarm`` so that none outlives a broken test.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from _procs import SIGNAL_WAIT
from unirank.contract import DEFAULT_GRACE_PERIOD
from unirank.runfolder import RunFolder
from unirank.signals import FORWARDED
from unirank.supervisor.engine import Supervisor, WorkerLaunch
from unirank.supervisor.plan import Plan, Worker
from unirank.supervisor.summary import RunResult
from unirank.supervisor.workerenv import WorkerWiring

#: the default grace period, as the lines show it
GRACE = f"{DEFAULT_GRACE_PERIOD:g}"
#: every child ends by this many seconds, whatever happens
ALARM = 60
_HEAD = f"import os, signal, sys\nsignal.alarm({ALARM})\n"


def _plan(n: int) -> Plan:
    return Plan(mode="spawn", workers=tuple(Worker(r, r) for r in range(n)), world_size=n,
                local_world_size=n, nnodes=1, node_rank=0, master_addr="127.0.0.1",
                master_port=29500, run_id="engine-test", node_name="n1")


def _launches(programs: Sequence[str], tmp: Path) -> list[WorkerLaunch]:
    plan = _plan(len(programs))
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "FIFO": str(tmp / "fifo")}
    return [WorkerLaunch(rank=r, local_rank=r, argv=(sys.executable, "-c", _HEAD + program),
                         plan=plan, worker=plan.workers[r], base=base,
                         wiring=WorkerWiring(error_file=str(tmp / f"error{r}.json")))
            for r, program in enumerate(programs)]


class Console:
    """The supervisor's console: one file for stdout and stderr, read after the run."""

    def __init__(self, tmp: Path) -> None:
        self.path = tmp / "console.txt"
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def text(self) -> str:
        os.close(self.fd)
        return self.path.read_text()


def _run(programs: Sequence[str], tmp: Path, **options: object) -> tuple[RunResult, str]:
    os.mkfifo(tmp / "fifo")
    console = Console(tmp)
    supervisor = Supervisor(_launches(programs, tmp), node_name="n1", out_fd=console.fd,
                            err_fd=console.fd, **options)  # type: ignore[arg-type]
    result = supervisor.run()
    return result, console.text()


def _codes(result: RunResult) -> dict[int, int]:
    return {e.rank: e.returncode for e in result.exits}


WAITS = "signal.pause()\n"
#: opens the FIFO for writing once its SIGTERM is ignored, then waits
IGNORES_TERM = ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "open(os.environ['FIFO'], 'w').close()\nsignal.pause()\n")
#: fails with 3 once the other side opened the FIFO
FAILS_AFTER_FIFO = "open(os.environ['FIFO']).read()\nsys.exit(3)\n"


def test_a_failure_stops_the_others_with_sigterm_and_is_blamed(tmp_path: Path) -> None:
    result, console = _run([WAITS, "sys.exit(3)"], tmp_path)
    assert _codes(result) == {0: -signal.SIGTERM, 1: 3}
    assert result.first_failure is not None and result.first_failure.rank == 1
    assert result.exit_code == 3
    stopped = {e.rank: e.stopped for e in result.exits}
    assert stopped == {0: True, 1: False}
    assert ("unirank run: rank 1 (local rank 1) on node n1 ended with exit code 3; stopping the "
            f"other 1 worker: SIGTERM now, SIGKILL after {GRACE} s") in console
    assert result.stop_signal is None and not result.unreaped


def test_a_worker_that_ignores_sigterm_is_killed_at_the_end_of_the_grace_period(
        tmp_path: Path) -> None:
    result, console = _run([IGNORES_TERM, FAILS_AFTER_FIFO], tmp_path, grace_period=0.2)
    assert _codes(result) == {0: -signal.SIGKILL, 1: 3}, console
    assert result.first_failure is not None and result.first_failure.rank == 1
    assert "SIGKILL after 0.2 s" in console


def test_all_ok_is_no_failure(tmp_path: Path) -> None:
    result, console = _run(["print('hello', flush=True)", "sys.exit(0)"], tmp_path)
    assert _codes(result) == {0: 0, 1: 0}
    assert result.first_failure is None and result.exit_code == 0
    assert "hello" in console and "unirank run:" not in console


def test_the_requeue_code_is_no_failure(tmp_path: Path) -> None:
    result, console = _run(["sys.exit(79)", "sys.exit(79)"], tmp_path)
    assert result.first_failure is None and result.exit_code == 79
    assert "stopping" not in console


# A stop signal: rank 0 waits until rank 1 has its handler (the FIFO), then sends SIGINT to
# the supervisor; each worker ends with 0 when the supervisor forwards it. (Handlers do nothing:
# a worker waits for the signal's number on a pipe, see _procs.SIGNAL_WAIT.)
_ON_INT = SIGNAL_WAIT + "on_signals(signal.SIGINT)\n"
SENDS_INT = (_ON_INT + "open(os.environ['FIFO']).read()\nos.kill(os.getppid(), "
             "signal.SIGINT)\nnext_signal()\nsys.exit(0)\n")
READY = _ON_INT + "open(os.environ['FIFO'], 'w').close()\nnext_signal()\nsys.exit(0)\n"


def test_a_stop_signal_is_forwarded_and_the_workers_end_without_blame(tmp_path: Path) -> None:
    result, console = _run([SENDS_INT, READY], tmp_path)
    assert _codes(result) == {0: 0, 1: 0}, console
    assert result.stop_signal == signal.SIGINT and result.first_failure is None
    assert (f"unirank run: got SIGINT: forwarded to the workers; SIGKILL in {GRACE} s (SIGINT "
            "again to kill now)") in console


# A second stop signal: each worker answers the forwarded SIGINT by sending another one to the
# supervisor (which has then surely handled the first), and waits.
_INT_AGAIN = "while True:\n    next_signal()\n    os.kill(os.getppid(), signal.SIGINT)\n"
SENDS_INT_TWICE = (_ON_INT + "open(os.environ['FIFO']).read()\nos.kill(os.getppid(), "
                   "signal.SIGINT)\n" + _INT_AGAIN)
READY_AGAIN = _ON_INT + "open(os.environ['FIFO'], 'w').close()\n" + _INT_AGAIN


def test_a_second_stop_signal_kills_at_once(tmp_path: Path) -> None:
    result, console = _run([SENDS_INT_TWICE, READY_AGAIN], tmp_path)
    assert _codes(result) == {0: -signal.SIGKILL, 1: -signal.SIGKILL}, console
    assert result.stop_signal == signal.SIGINT and result.first_failure is None


# USR1 is forwarded (not a stop signal): each worker ends with 0 when it gets it.
_ON_USR1 = SIGNAL_WAIT + "on_signals(signal.SIGUSR1)\n"
SENDS_USR1 = (_ON_USR1 + "open(os.environ['FIFO']).read()\n"
              "os.kill(os.getppid(), signal.SIGUSR1)\nnext_signal()\nsys.exit(0)\n")
READY_USR1 = _ON_USR1 + "open(os.environ['FIFO'], 'w').close()\nnext_signal()\nsys.exit(0)\n"


def test_usr1_is_forwarded_without_stopping(tmp_path: Path) -> None:
    """USR1 named among the signals to forward (as ``--signals-to-handle`` or a job's warning
    exported in UNIRANK_STOP_SIGNALS does; the default set has it not). The Supervisor runs in
    this test's process, which the worker signals: without USR1 handled, USR1 would end it."""
    signals = (*(int(s) for s in FORWARDED),)
    result, console = _run([SENDS_USR1, READY_USR1], tmp_path, signals=signals)
    assert _codes(result) == {0: 0, 1: 0}, console
    assert result.stop_signal is None and result.first_failure is None
    assert "unirank run:" not in console


class PipeWatch:
    """A :class:`~unirank.supervisor.engine.WorldWatch` whose news is a line in a pipe: the
    test's own implementation of the protocol, with a real descriptor."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)

    def fileno(self) -> int:
        return self.read_fd

    def world_change(self) -> str | None:
        try:
            data = os.read(self.read_fd, 4096)
        except BlockingIOError:
            return None
        return data.decode().strip() or None

    def keep_at(self, root: RunFolder) -> None:
        pass

    def kind(self) -> str | None:
        return None


def test_a_change_of_the_world_stops_the_workers(tmp_path: Path) -> None:
    watch = PipeWatch()
    os.write(watch.write_fd, b"node n2 was lost\n")
    try:
        result, console = _run([WAITS, WAITS], tmp_path, watch=watch)
    finally:
        os.close(watch.read_fd)
        os.close(watch.write_fd)
    assert result.world_changed == "node n2 was lost"
    assert _codes(result) == {0: -signal.SIGTERM, 1: -signal.SIGTERM}
    assert result.first_failure is None
    assert ("unirank run: node n2 was lost; stopping the workers: SIGTERM now, SIGKILL after "
            f"{GRACE} s") in console


def test_the_supervisor_refuses_to_run_outside_the_main_thread(tmp_path: Path) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            Supervisor(_launches(["sys.exit(0)"], tmp_path), node_name="n1").run()
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    assert errors and "main thread" in str(errors[0])


# Rank 0 starts a child in its group that ignores SIGTERM and writes its pid; rank 1 fails once
# that child is ready (the FIFO).
STARTS_CHILD = """import subprocess
child = subprocess.Popen([sys.executable, "-c", "import os, signal; signal.alarm(60); "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); open(os.environ['FIFO'], 'w').close(); "
    "signal.pause()"])
with open(os.environ['FIFO'] + '.pid', 'w') as f:
    f.write(str(child.pid))
signal.pause()
"""


def test_the_workers_groups_are_killed_whole(tmp_path: Path) -> None:
    """A worker's child that ignores the teardown's SIGTERM is gone when run() returns."""
    result, console = _run([STARTS_CHILD, FAILS_AFTER_FIFO], tmp_path)
    assert _codes(result) == {0: -signal.SIGTERM, 1: 3}, console
    pid = int((tmp_path / "fifo.pid").read_text())
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # gone and reaped
    try:
        ready, _, _ = select.select([fd], [], [], 30)
    finally:
        os.close(fd)
    assert ready, f"rank 0's child {pid} outlived the run"
