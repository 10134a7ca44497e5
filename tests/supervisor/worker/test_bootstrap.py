"""The worker bootstrap: its reading of the environment, and its one-line rendezvous errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from _procs import free_port
from unirank.supervisor.worker.info import read_worker_info


def test_read_worker_info() -> None:
    info = read_worker_info({
        "RANK": "5", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
        "MASTER_ADDR": "head", "MASTER_PORT": "2345", "UNIRANK_NODE_NAME": "b",
        "UNIRANK_NODE_NAMES": "a[1-2]", "UNIRANK_INIT_TIMEOUT": "9", "UNIRANK_STORE_FD": "7",
        "UNIRANK_RANKS_PER_NODE": "4(x3)",
    })
    assert (info.rank, info.world_size, info.node_rank) == (5, 8, 1)
    assert (info.master_addr, info.master_port, info.init_timeout) == ("head", 2345, 9.0)
    assert info.store_fd == 7
    assert [info.node_of(r) for r in (0, 3, 4, 7)] == ["a1", "a1", "b", "b"]  # 4-7: this node
    assert info.node_of(8) == "node rank 2"
    assert info.store_node == "a1"
    bare = read_worker_info({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                             "MASTER_ADDR": "me", "MASTER_PORT": "1", "UNIRANK_NODE_NAME": "me",
                             "UNIRANK_RANKS_PER_NODE": "2(x2)"})
    assert bare.node_of(1) == "me" and bare.node_of(2) == "node rank 1"
    assert bare.store_fd is None and bare.init_timeout == 300.0
    unplaced = read_worker_info({"RANK": "2", "GROUP_RANK": "1", "WORLD_SIZE": "3",
                                 "MASTER_ADDR": "head", "MASTER_PORT": "1",
                                 "UNIRANK_NODE_NAME": "me"})
    assert unplaced.node_of(2) == "me" and unplaced.node_of(1) is None  # placement not known
    assert unplaced.store_node == "node rank 0"


def test_missing_variables_are_reported() -> None:
    with pytest.raises(SystemExit, match="RANK is not set"):
        read_worker_info({"WORLD_SIZE": "2", "MASTER_PORT": "1"})
    with pytest.raises(SystemExit, match="MASTER_ADDR is not set"):  # no default of its own
        read_worker_info({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1"})


@pytest.mark.integration
def test_unreachable_store_fails_within_the_init_timeout(tmp_path: Path) -> None:
    port = free_port()  # where nothing listens
    (tmp_path / "never.py").write_text("print('script ran')\n")
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "UNIRANK_INIT_TIMEOUT": "2",
           "UNIRANK_NODE_NAMES": "head,me", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-m", "unirank.supervisor.worker.bootstrap",
                             "never.py"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "script ran" not in result.stdout
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"unirank: rank 1: could not reach the rendezvous store of rank 0 at "
                           f"127.0.0.1:{port} within 2 s")
    assert "node 0 (head)" in last
