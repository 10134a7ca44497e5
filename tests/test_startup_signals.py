"""SIGINT or SIGTERM while a rank is still connecting to the rendezvous store, or waiting for
the others to join, ends it at once: SIGINT with one line and exit code 130, SIGTERM as the
signal's default; never torch's C++ frame dump or a traceback. An init timeout with no store
fires at the timeout, not at torch's 2.5 times.

Real processes: a hand-set torchrun-style rank running ``examples/helloworld.py`` (the
:func:`unirank.init` path) and a worker bootstrap. Each has a 300 s init timeout and the test a
60 s subprocess timeout, so a rank that does not stop fails the test.

"Still connecting" is staged without timing: the test listens on the master port with a full
accept queue (one connection it never accepts), so the kernel drops the rank's SYNs and its
connection attempts stay in SYN_SENT; the test waits until it sees one in ``/proc/net/tcp``
(polling that file: nothing signals a connection attempt), then sends the signal. "Waiting for
the others" is staged through the store: the test waits on rank 0's join key.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from _procs import free_port, launcher_free_environ
from unirank.storekeys.init import init_prefix
from unirank.storekeys.join import join_key

REPO = Path(__file__).resolve().parents[1]
_NOISE = ("Traceback", "frame #", "Exception raised from", "Interrupted system call", "[c10d]")
#: rank 0's join key under :func:`unirank.init`'s first prefix
_JOIN_0 = f"{init_prefix(0)}/join/{join_key(0)}"


def _env(rank: int, port: int, timeout: str = "300") -> dict[str, str]:
    return launcher_free_environ({
        "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "UNIRANK_INIT_TIMEOUT": timeout})


@pytest.fixture
def full_listener() -> Iterator[int]:
    """A port whose accept queue is full: connection attempts to it stay in SYN_SENT."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = int(listener.getsockname()[1])
    filler = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        yield port
    finally:
        filler.close()
        listener.close()


def _syn_sent_to(port: int) -> bool:
    remote = f"0100007F:{port:04X}"
    with open("/proc/net/tcp") as table:
        return any(fields[2] == remote and fields[3] == "02"
                   for fields in (line.split() for line in list(table)[1:]))


def _when_connecting(proc: subprocess.Popen[str], port: int) -> None:
    deadline = time.monotonic() + 60
    while not _syn_sent_to(port):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the rank never tried to connect"
        time.sleep(0.01)


def _ended(proc: subprocess.Popen[str]) -> str:
    try:
        return proc.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        try:  # its signal state (what it blocked, ignored, caught): the CI saw it ignore SIGINT?
            masks = [line for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                     if line.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt"))]
        except OSError:
            masks = []
        proc.kill()
        pytest.fail(f"the rank did not stop ({', '.join(masks)}): "
                    f"{proc.communicate()[1][-2000:]}")


def _start(command: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(command, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


_HELLO = [sys.executable, "examples/helloworld.py"]
_BOOTSTRAP = [sys.executable, "-m", "unirank.supervisor.worker.bootstrap", "examples/helloworld.py"]


@pytest.mark.parametrize("command", [_HELLO, _BOOTSTRAP], ids=["init", "bootstrap"])
def test_sigint_while_connecting(full_listener: int, command: list[str]) -> None:
    proc = _start(command, _env(1, full_listener))
    _when_connecting(proc, full_listener)
    proc.send_signal(signal.SIGINT)
    err = _ended(proc)
    assert proc.returncode == 130, err
    assert err.splitlines() == [f"unirank: rank 1: interrupted (SIGINT) while connecting to the "
                                f"rendezvous store at 127.0.0.1:{full_listener}"], err


def test_sigterm_while_connecting(full_listener: int) -> None:
    proc = _start(_HELLO, _env(1, full_listener))
    _when_connecting(proc, full_listener)
    proc.send_signal(signal.SIGTERM)
    err = _ended(proc)
    assert proc.returncode == -signal.SIGTERM, err
    assert not any(noise in err for noise in _NOISE), err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_while_waiting_for_the_others(sig: signal.Signals) -> None:
    import torch.distributed as dist

    port = free_port()
    proc = _start(_HELLO, _env(0, port))
    try:
        watcher = dist.TCPStore("127.0.0.1", port, None, False,  # type: ignore[attr-defined]
                                timedelta(seconds=60), wait_for_workers=False)
        watcher.wait([_JOIN_0], timedelta(seconds=60))
        del watcher
    finally:
        proc.send_signal(sig)
    err = _ended(proc)
    if sig == signal.SIGINT:
        assert proc.returncode == 130, err
        assert err.splitlines() == ["unirank: rank 0: interrupted (SIGINT) while waiting for "
                                    "the other ranks to join"], err
    else:
        assert proc.returncode == -signal.SIGTERM, err
    assert not any(noise in err for noise in _NOISE), err


def test_init_timeout_without_a_store_fires_at_the_timeout() -> None:
    """Nothing listens at the master port: the rank gives up at its 6 s init timeout; torch's
    own connect would take about 2.5 times that (15 s, and the interpreter's start), past this
    test's 14 s bound."""
    port = free_port()
    proc = _start([sys.executable, "-m", "unirank", "hello"], _env(1, port, timeout="6"))
    try:
        err = proc.communicate(timeout=14)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the init timeout did not fire in time: {proc.communicate()[1][-2000:]}")
    assert proc.returncode != 0, err
    assert f"could not reach the rendezvous store at 127.0.0.1:{port} within 6 s" in err, err
    assert not any(noise in err for noise in _NOISE), err
    assert len(err.splitlines()) == 1, err
