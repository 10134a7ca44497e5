"""A master host that does not resolve ends every path at once with one line.

The unit tests call :func:`unirank.resolve.require_resolvable`; the slow name server is the one
mock (``socket.getaddrinfo`` replaced by a call that blocks: a dead DNS cannot be staged here).
The process tests run the real thing with a 300 s init timeout and a 60 s subprocess timeout,
so a hang fails the test: ``unirank run -n 2`` (the parent's check) and a hand-set
torchrun-style rank 0 running ``examples/helloworld.py`` (the check in :func:`unirank.init`'s
store opening), and a worker bootstrap given the name directly.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from _procs import Runner, free_port, launcher_free_environ
from unirank import netroute, resolve
from unirank.doctor import netinfo
from unirank.errors import ConfigError
from unirank.resolve import master_addr_source, require_resolvable
from unirank.supervisor.listen import store_family

REPO = Path(__file__).resolve().parents[1]
BAD = "no.such.host.invalid"
#: what a traceback or torch's C++ error report would print
_NOISE = ("Traceback", "frame #", "Exception raised from", "[c10d]")


def test_names_and_addresses_that_resolve_pass() -> None:
    refused: dict[str, str] = {}
    for host in ("127.0.0.1", "::1", "[::1]", "localhost", socket.gethostname()):
        try:
            require_resolvable(host, source="MASTER_ADDR")
        except ConfigError as refusal:
            refused[host] = str(refusal)
    assert refused == {}


def test_a_name_that_does_not_resolve_is_one_line_naming_name_source_and_hint() -> None:
    with pytest.raises(ConfigError) as info:
        require_resolvable(BAD, source="--master-addr")
    message = str(info.value)
    assert message.startswith(f"--master-addr='{BAD}': the master host does not resolve")
    assert "HINT: give the host name or address of rank 0's node" in message
    assert f"getent hosts {BAD}" in message
    assert "\n" not in message


def test_a_name_server_that_does_not_answer_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def blocked(*_args: Any, **_kwargs: Any) -> Any:
        release.wait(60)
        raise socket.gaierror(-3, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", blocked)
    try:
        with pytest.raises(ConfigError, match="no answer from the name service within 0.2 s"):
            require_resolvable("slow.example", source="MASTER_ADDR", timeout=0.2)
    finally:
        release.set()


def _blocking_name_service(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event,
                                                                      list[str]]:
    """``socket.getaddrinfo`` and ``gethostbyaddr`` that block until the event is set, when
    asked from a bounded look-up's thread; asked from the main thread (an unbounded look-up) they
    answer at once, and the name is recorded in the list. The bound is made 0.05 s."""
    release, unbounded = threading.Event(), []

    def answer(name: str, port: Any = None, *_args: Any, **_kwargs: Any) -> Any:
        if threading.current_thread() is threading.main_thread():
            unbounded.append(name)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port or 0))]
        release.wait()
        raise socket.gaierror(-3, "Temporary failure in name resolution")

    def reverse(address: str) -> Any:
        answer(address)
        return ("localhost", [], [address])

    monkeypatch.setattr(socket, "getaddrinfo", answer)
    monkeypatch.setattr(socket, "gethostbyaddr", reverse)
    monkeypatch.setattr(resolve, "RESOLVE_TIMEOUT", 0.05)
    return release, unbounded


def test_every_name_look_up_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's family, the route to an address and doctor's look-ups, for a name whose
    look-up never ends: each gives its "does not resolve" answer, and none asked unbounded."""
    release, unbounded = _blocking_name_service(monkeypatch)
    try:
        assert store_family("slow.example") == socket.AF_INET6
        assert netroute.route_source("slow.example") is None
        found = netinfo.resolve("slow.example", limit=0.05)
        assert (found.answer, found.error) == (None, "no answer within 0.05 s")
        back = netinfo.reverse_lookup("192.0.2.1", limit=0.05)
        assert (back.answer, back.error) == (None, "no answer within 0.05 s")
    finally:
        release.set()
    assert unbounded == []


def test_the_source_is_where_the_launcher_found_it() -> None:
    assert master_addr_source({"master_addr": "first host of SLURM_STEP_NODELIST"}) == \
        "first host of SLURM_STEP_NODELIST"
    assert master_addr_source({}) == "MASTER_ADDR"


def _run(command: list[str], extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = launcher_free_environ({"UNIRANK_INIT_TIMEOUT": "300", **extra})
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def _assert_one_line(result: subprocess.CompletedProcess[str], prefix: str, source: str) -> None:
    assert result.returncode != 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{prefix}{source}='{BAD}': the master host does not resolve"), \
        result.stderr
    assert not any(noise in result.stderr for noise in _NOISE), result.stderr


@pytest.mark.parametrize("how", ["env", "option"])
def test_unirank_run_refuses_before_starting_workers(how: str) -> None:
    """An inherited MASTER_ADDR counts on several nodes only (one node uses 127.0.0.1)."""
    given = ["--master-addr", BAD] if how == "option" else ["--nnodes", "2", "--node-rank", "1"]
    result = _run(Runner.command(["-n", "2", *given, "examples/helloworld.py"]),
                  {"MASTER_ADDR": BAD} if how == "env" else {})
    _assert_one_line(result, "unirank run: error: ",
                     "--master-addr" if how == "option" else "MASTER_ADDR")
    assert result.returncode == 2
    assert result.stdout == ""


def test_a_torchrun_style_rank_0_ends_in_init() -> None:
    result = _run([sys.executable, "examples/helloworld.py"], {
        "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": BAD, "MASTER_PORT": str(free_port())})
    _assert_one_line(result, "helloworld.py: error: ", "MASTER_ADDR")


def test_a_worker_bootstrap_given_the_name_ends_with_one_line() -> None:
    result = _run([sys.executable, "-m", "unirank.supervisor.worker.bootstrap",
                    "examples/helloworld.py"], {
        "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": BAD, "MASTER_PORT": str(free_port())})
    _assert_one_line(result, "unirank: rank 1: ", "MASTER_ADDR")
    assert result.returncode == 1
