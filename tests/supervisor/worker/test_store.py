"""A worker's side of the rendezvous store (:mod:`unirank.supervisor.worker.store`), in this
process on real TCPStores served on 127.0.0.1: the join of a world of one, a rank claimed by
two nodes, an unreachable store (one line, exit 1, within the init timeout), the exit barrier,
and the supervisor's pipes (linger, done, private)."""

from __future__ import annotations

import dataclasses
import os
import socket
from typing import Any

import pytest

from _procs import free_port
from unirank.contract import NODE_NAME_VAR, NODE_NAMES_VAR, SUPERVISOR_PID_VAR
from unirank.joincheck import ABORT_PREFIX, ALL_KEY
from unirank.supervisor.worker.info import WorkerInfo, read_worker_info
from unirank.supervisor.worker.store import (
    EXIT_ALL_KEY,
    EXIT_COUNT_KEY,
    RANK_CLAIM_PREFIX,
    RENDEZVOUS_FAILED,
    _claim_rank,
    done,
    exit_barrier,
    linger,
    private_fds,
    rendezvous,
)

#: the worker environment of rank 1 of 2 on node2 (one worker a node), its store at 127.0.0.1
WORKER_ENV = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "1",
              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", NODE_NAME_VAR: "node2",
              NODE_NAMES_VAR: "node[1-2]", "UNIRANK_INIT_TIMEOUT": "30",
              SUPERVISOR_PID_VAR: str(os.getpid())}


def _info(**fields: Any) -> WorkerInfo:
    """What the worker of :data:`WORKER_ENV` reads, with ``fields`` changed."""
    return dataclasses.replace(read_worker_info(WORKER_ENV), **fields)




def test_a_world_of_one_joins_on_the_listening_socket_it_was_given() -> None:
    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    port = listening.getsockname()[1]
    info = _info(rank=0, world_size=1, node_rank=0, node_name="node1", node_names="node1",
                 master_port=port, store_fd=listening.detach())
    store = rendezvous(info)
    assert bytes(store.get(f"{RANK_CLAIM_PREFIX}0")).decode() == \
        f"node1 (pid {os.getpid()})"


def test_a_rank_claimed_by_two_nodes_fails_naming_both_and_aborts_the_join(
        served: tuple[Any, int], capsys: pytest.CaptureFixture[str]) -> None:
    store, port = served
    _claim_rank(store, _info(master_port=port, node_name="node2"))
    with pytest.raises(SystemExit) as exit_info:
        _claim_rank(store, _info(master_port=port, node_name="node3", supervisor_pid=1))
    assert exit_info.value.code == RENDEZVOUS_FAILED
    pid = os.getpid()
    reason = (f"rank 1 (node rank 1) is claimed by two nodes, node2 (pid {pid}) and node3 "
              f"(pid 1). HINT: give every node a distinct --node-rank, 0 to --nnodes - 1 (or "
              f"let srun/mpirun give it)")
    assert capsys.readouterr().err == f"unirank: rank 1: {reason}\n"
    assert bytes(store.get(ALL_KEY)).decode() == ABORT_PREFIX + reason


def test_an_unreachable_store_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    with pytest.raises(SystemExit) as exit_info:
        rendezvous(_info(master_port=port, init_timeout=0.3))
    assert exit_info.value.code == RENDEZVOUS_FAILED
    err = capsys.readouterr().err
    assert err.startswith(f"unirank: rank 1: could not reach the rendezvous store of rank 0 at "
                          f"127.0.0.1:{port} within 0.3 s (")
    assert err.endswith("HINT: check that node 0 (node1) started unirank run with the same "
                        "--master-port, and that this node can reach that address\n")
    assert err.count("\n") == 1


def test_the_exit_barrier_is_complete_when_every_rank_counted_itself_out(
        served: tuple[Any, int]) -> None:
    store, _port = served
    exit_barrier(store, _info(exit_timeout=5.0), wait=False)
    assert int(store.add(EXIT_COUNT_KEY, 0)) == 1
    assert not store.check([EXIT_ALL_KEY])
    exit_barrier(store, _info(rank=0, exit_timeout=5.0), wait=True)
    assert int(store.add(EXIT_COUNT_KEY, 0)) == 2
    assert bytes(store.get(EXIT_ALL_KEY)) == b"1"


class _LostStore:
    """Stand-in for a store whose server is gone (every call fails, as torch's client does);
    it records what was asked of it."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []

    def add(self, key: str, amount: int) -> int:
        self.asked.append((key, amount))
        raise RuntimeError("Connection reset by peer")


def test_the_exit_barrier_never_raises() -> None:
    lost = _LostStore()
    exit_barrier(lost, _info(exit_timeout=5.0), wait=True)  # no exception
    assert lost.asked == [(EXIT_COUNT_KEY, 1)]


def test_linger_returns_when_the_supervisor_closes_the_pipe() -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, b"not yet")
    os.close(write_end)
    try:
        linger(_info(rank=0, linger_fd=read_end))
        assert os.read(read_end, 1) == b""  # all read, up to the end
    finally:
        os.close(read_end)
    linger(_info(rank=0, linger_fd=None))  # no pipe: nothing to wait for


def test_done_closes_the_done_pipe_and_private_fds_keeps_them_from_children() -> None:
    linger_read, linger_write = os.pipe()
    done_read, done_write = os.pipe()
    for fd in (linger_read, done_write):
        os.set_inheritable(fd, True)
    info = _info(linger_fd=linger_read, done_fd=done_write)
    try:
        private_fds(info)
        assert not os.get_inheritable(linger_read)
        assert not os.get_inheritable(done_write)
        done(info)
        assert os.read(done_read, 1) == b""  # the supervisor sees the end of the pipe
    finally:
        for fd in (linger_read, linger_write, done_read):
            os.close(fd)
