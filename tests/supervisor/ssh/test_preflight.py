"""The pre-flight of ``unirank run --hosts``: the probe line, run here by ``sh`` as a host runs
it, and how each answer becomes a host's facts or its one-line refusal."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from unirank.supervisor.ssh.preflight import (
    HostFacts,
    Refusal,
    _verdict,
    local_versions,
    probe_line,
)

SRC = str(Path(__file__).resolve().parents[3] / "src")
LOCAL = local_versions(platform.python_version())


def _probe(cwd: str, python: str, *, port: bool) -> HostFacts | Refusal:
    done = subprocess.run(["sh", "-c", probe_line(cwd, python, SRC, port=port)],
                          capture_output=True, text=True, timeout=60, check=False)
    return _verdict("node1", done.returncode, done.stdout, done.stderr, cwd, python, LOCAL)


def test_a_good_host_reports_its_versions_and_a_free_port(tmp_path: Path) -> None:
    facts = _probe(str(tmp_path), sys.executable, port=True)
    assert isinstance(facts, HostFacts), facts
    assert (facts.unirank, facts.torch) == (LOCAL["unirank"], LOCAL["torch"])
    assert facts.port is not None and facts.port > 0
    assert _probe(str(tmp_path), sys.executable, port=False) == HostFacts(
        "node1", platform.python_version(), str(LOCAL["unirank"]), str(LOCAL["torch"]), None)


def test_a_missing_folder_or_interpreter_is_named(tmp_path: Path) -> None:
    gone = str(tmp_path / "gone")
    assert _probe(gone, sys.executable, port=False) == Refusal(
        "node1", f"has no folder {gone} (the job runs in the same working directory on every "
        "host)")
    refusal = _probe(str(tmp_path), "/no/such/python3", port=False)
    assert isinstance(refusal, Refusal)
    assert refusal.line().startswith("host node1: has no interpreter /no/such/python3")


@pytest.mark.parametrize(("code", "out", "err", "says"), [
    (255, "", "ssh: connect to host 127.0.1.9 port 22: Connection refused\n",
     "host h: ssh cannot reach it or log in: ssh: connect to host 127.0.1.9 port 22: "
     "Connection refused"),
    (1, "", "Traceback...\nImportError: bad\n", "host h: its check failed: ImportError: bad"),
    (0, 'UNIRANK-PREFLIGHT {"python": "3", "torch": null, "unirank": "0.1.0"}', "",
     "host h: /py has no torch"),
    (0, 'UNIRANK-PREFLIGHT {"python": "3", "torch": "1.0", "unirank_error": "E()"}', "",
     "host h: /py cannot import unirank: E()"),
    (0, 'UNIRANK-PREFLIGHT {"python": "3", "torch": "0.0.1", "unirank": "0.1.0"}', "",
     "host h: has torch 0.0.1, this host 2.x (install the same versions everywhere)"),
])
def test_failed_checks_are_one_line_each(code: int, out: str, err: str, says: str) -> None:
    local = {"python": "3", "unirank": "0.1.0", "torch": "2.x"}
    refusal = _verdict("h", code, out, err, "/w", "/py", local)
    assert isinstance(refusal, Refusal)
    assert refusal.line() == says
    assert "\n" not in refusal.line()


def test_the_probe_does_not_import_torch(tmp_path: Path) -> None:
    line = probe_line(str(tmp_path), sys.executable, SRC, port=False)
    env = {**os.environ, "PYTHONVERBOSE": "1"}
    done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=60,
                          check=True, env=env)
    assert "import 'torch'" not in done.stderr
