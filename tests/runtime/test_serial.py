"""Getters, collectives and helpers without a process group (they must degrade gracefully)."""

from __future__ import annotations

import logging

import pytest
import torch

import unirank as ur
from unirank.distenv import DistEnv
from unirank.runtime import state


def test_getters_before_init_answer_from_the_launcher(use_env: None) -> None:
    state.set_dist_env(DistEnv(
        launcher="slurm", rank=5, local_rank=1, world_size=8, local_world_size=2, node_rank=2,
        num_nodes=4,
    ))
    assert not ur.is_initialized()
    assert (ur.get_rank(), ur.get_world_size()) == (5, 8)
    assert (ur.get_local_rank(), ur.get_local_world_size()) == (1, 2)
    assert (ur.get_node_rank(), ur.get_nnodes()) == (2, 4)
    assert ur.backend() is None
    assert ur.device() == torch.device("cpu")


def test_dist_env_detects_once_and_caches(use_env: None) -> None:
    state.set_dist_env(None)
    first = ur.dist_env()
    assert ur.dist_env() is first


def test_hostname_is_the_detected_node_name() -> None:
    """The runtime names the node as detection did (the rule: tests/launchers/test_node_name)."""
    state.set_dist_env(DistEnv(launcher="slurm", node_name="node7"))
    try:
        assert ur.hostname() == "node7"
    finally:
        state.set_dist_env(None)


@pytest.mark.parametrize(
    ("op", "expected"),
    [("SUM", 5), ("sum", 5), ("MIN", 5), ("max", 5), ("PRODUCT", 5), ("MEAN", 5.0),
     ("avg", 5.0)],
)
def test_all_reduce_number_serial(serial: DistEnv, op: str, expected: float) -> None:
    result = ur.all_reduce(5, op)
    assert result == expected
    assert type(result) is type(expected)


def test_all_reduce_tensor_serial_returns_the_same_tensor(serial: DistEnv) -> None:
    data = torch.tensor([1.0, 2.0])
    assert ur.all_reduce(data) is data
    assert ur.all_reduce(data, "mean") is data
    assert data.tolist() == [1.0, 2.0]


def test_all_reduce_serial_returns_what_ignite_returns_and_warns(serial: DistEnv) -> None:
    with pytest.warns(UserWarning, match="unknown reduce op 'median'"):
        assert ur.all_reduce(1, "median") == 1
    with pytest.warns(UserWarning, match="Unhandled input type"):
        assert ur.all_reduce("abc") == "abc"
    with pytest.warns(UserWarning, match="Unhandled input type"):
        assert ur.all_reduce([1, 2]) == [1, 2]
    with pytest.raises(TypeError, match="MEAN needs a floating-point tensor"):
        ur.all_reduce(torch.tensor([1]), "MEAN")


def test_all_reduce_accepts_reduce_op_values(serial: DistEnv) -> None:
    import torch.distributed as dist

    assert ur.all_reduce(3, dist.ReduceOp.MAX) == 3
    assert ur.all_reduce(3, dist.ReduceOp.AVG) == 3.0


def test_all_gather_serial(serial: DistEnv) -> None:
    assert ur.all_gather(3) == [3]
    assert ur.all_gather("abc") == ["abc"]
    assert ur.all_gather({"k": (1, 2)}) == [{"k": (1, 2)}]
    assert ur.all_gather(torch.tensor(7)).tolist() == 7  # as it is, as in ignite
    assert ur.all_gather(torch.tensor([[1, 2]])).tolist() == [[1, 2]]


def test_broadcast_and_barrier_serial(serial: DistEnv) -> None:
    data = torch.tensor([4.0])
    assert ur.broadcast(data) is data
    assert ur.broadcast("text", src=0) == "text"
    assert ur.broadcast(2.5) == 2.5
    table = {"k": [1, (2, 3)]}
    assert ur.broadcast(table, src=0) is table  # any picklable object, as it is
    ur.barrier()  # returns at once


def test_one_rank_only(use_env: None) -> None:
    calls: list[int] = []

    @ur.one_rank_only()
    def on_zero(x: int) -> int:
        calls.append(x)
        return x * 2

    @ur.one_rank_only(rank=1)
    def on_one(x: int) -> int:
        calls.append(-x)
        return x

    state.set_dist_env(DistEnv(launcher="torchrun", rank=1, world_size=2, local_world_size=2,
                               local_rank=1))
    assert on_zero(3) is None
    assert on_one(4) == 4
    state.set_dist_env(DistEnv(launcher="local"))
    assert on_zero(5) == 10
    assert calls == [-4, 5]
    assert on_zero.__name__ == "on_zero"


def test_one_rank_first_serial_runs_the_block(serial: DistEnv) -> None:
    ran = []
    with ur.one_rank_first():
        ran.append(1)
    assert ran == [1]


def test_print0_prints_on_rank_zero_only(use_env: None, capsys: pytest.CaptureFixture[str]) -> None:
    state.set_dist_env(DistEnv(launcher="torchrun", rank=1, world_size=2, local_world_size=2,
                               local_rank=1))
    ur.print0("from one")
    state.set_dist_env(DistEnv(launcher="local"))
    ur.print0("from zero", end="!\n")
    assert capsys.readouterr().out == "from zero!\n"


def test_logger_prefixes_rank_and_adds_one_handler(use_env: None) -> None:
    import io

    state.set_dist_env(DistEnv(launcher="torchrun", rank=2, world_size=4, local_world_size=4,
                               local_rank=2))
    logger = ur.get_logger("unirank.test.serial", fmt="[rank %(rank)d/%(world_size)d] %(message)s")
    assert ur.get_logger("unirank.test.serial") is logger
    assert len(logger.handlers) == 1
    stream = io.StringIO()
    handler = logger.handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)
    logger.info("ready")
    logger.debug("hidden")
    assert stream.getvalue() == "[rank 2/4] ready\n"
