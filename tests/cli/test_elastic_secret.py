"""A job whose nodes hold a rendezvous secret (``UNIRANK_RDZV_SECRET_FILE``), with real ``unirank
run`` nodes on loopback aliases: a node without it, or with another, is refused in one line and
the job runs at its world size.

Environment variables read: the caller's environment, from which launcher variables are removed
(see ``tests/_procs.py``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from _outputs import REPO, check_world, parse_hello

from _procs import Runner, free_port

pytestmark = pytest.mark.integration

TIMEOUT = 120.0
ENDPOINT, OTHER, STRANGER = "127.0.1.2", "127.0.1.1", "127.0.1.3"
HELLO = [str(REPO / "examples" / "helloworld.py"), "--backend", "gloo"]


def _node(runner: Runner, port: int, addr: str, name: str,
          env: dict[str, str]) -> subprocess.Popen[Any]:
    args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{ENDPOINT}:{port}", "--rdzv-conf", "join_timeout=60",
            "--local-addr", addr, *HELLO]
    return runner.start(args, text=True, env={"UNIRANK_NODE_NAME": name, **env},
                        drop=("OMP_NUM_THREADS",))


def _ended(proc: subprocess.Popen[Any]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, out or "", err or ""


def test_a_node_without_the_job_s_secret_is_refused_and_the_job_runs(
        runner: Runner, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("the-job-s-secret\n")
    secret.chmod(0o600)
    holds = {"UNIRANK_RDZV_SECRET_FILE": str(secret)}
    port = free_port()
    first = _node(runner, port, ENDPOINT, "nodeA", holds)
    where = f"the rendezvous 'none' at {ENDPOINT}:{port}"
    for env, said in [({}, f"this node has no rendezvous secret (UNIRANK_RDZV_SECRET) and "
                           f"{where} has one"),
                      ({"UNIRANK_RDZV_SECRET": "a guess"},
                       f"this node's rendezvous secret (UNIRANK_RDZV_SECRET) is not the one of "
                       f"{where}")]:
        code, _out, err = _ended(_node(runner, port, STRANGER, "nodeC", env))
        assert code == 2, err
        assert err.strip().splitlines() == [
            f"unirank run: error: {said} HINT: give every node of one job the same "
            "UNIRANK_RDZV_SECRET or UNIRANK_RDZV_SECRET_FILE (or none to all)"], err
        assert "the-job-s-secret" not in err and "a guess" not in err
    second = _node(runner, port, OTHER, "nodeB", holds)
    ended = [_ended(first), _ended(second)]
    assert [c for c, _o, _e in ended] == [0, 0], ended
    check_world(parse_hello(ended[0][1] + ended[1][1]), 2, addr=ENDPOINT,
                nodes=["nodeA", "nodeB"])
