"""ignite's names in one process: serial answers, argument checks made before any worker
starts, the deprecated set_local_rank, show_config's lines. The world-of-two behaviour (groups,
safe_mode, spawn) is compared with ignite itself in test_idist_compat.py."""

from __future__ import annotations

import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

import unirank as idist
from unirank.distenv import DistEnv
from unirank.errors import ConfigError
from unirank.runtime import collectives, ignite_options, state


def test_serial_answers(serial: DistEnv) -> None:
    assert idist.model_name() == "serial"
    assert idist.get_nproc_per_node() == 1
    assert "gloo" in idist.available_backends()
    assert idist.new_group([0]) == [0]
    assert idist.all_reduce(torch.tensor([2.0]), "SUM", [0]).tolist() == [2.0]
    assert idist.all_gather(5, [0]) == [5]
    assert idist.broadcast(Path("/x"), 0, True) == Path("/x")
    idist.sync()
    idist.sync(temporary=True)


def test_new_group_takes_a_list_of_ranks(serial: DistEnv) -> None:
    with pytest.raises(ValueError, match="list of global ranks"):
        idist.new_group((0, 1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="list of global ranks"):
        idist.new_group(["0"])  # type: ignore[list-item]


def test_bitwise_and_average_ops_are_known() -> None:
    assert collectives._op_name("and") == "AND"
    assert collectives._op_name("OR") == "OR"
    assert collectives._op_name("AVERAGE") == "MEAN"


def test_all_gather_tensors_with_shapes_cuts_each_rank_s_tensor_back_out(serial: DistEnv) -> None:
    tensor = torch.arange(6.0).reshape(2, 3)
    (only,) = idist.all_gather_tensors_with_shapes(tensor, [[2, 3]])
    assert torch.equal(only, tensor)


def test_one_rank_first_refuses_a_rank_outside_the_world(serial: DistEnv) -> None:
    with pytest.raises(ValueError, match="between 0 and 0"), idist.one_rank_first(1):
        pass
    with pytest.raises(ValueError, match="between 0 and 0"), idist.one_rank_first(1, True):
        pass


def test_one_rank_only_takes_ignite_s_positional_arguments(serial: DistEnv) -> None:
    assert idist.one_rank_only(0, True)(lambda: "ran")() == "ran"
    assert idist.one_rank_only(1, False)(lambda: "ran")() is None


def test_options_timedelta_and_seconds() -> None:
    options: dict[str, Any] = {"timeout": timedelta(minutes=2)}
    assert ignite_options.take_init_timeout(options, "initialize") == 120.0
    assert options == {}
    assert ignite_options.take_init_timeout({"timeout": 7}, "spawn") == 7
    assert ignite_options.take_init_timeout({}, "spawn") is None


def test_init_method_env_and_file_are_taken_tcp_refused_as_ignite_does() -> None:
    assert ignite_options.init_method(None) is None
    assert ignite_options.init_method("env://") is None
    assert ignite_options.init_method("file:///tmp/x") == "file:///tmp/x"
    with pytest.raises(ValueError, match="will hang"):
        ignite_options.init_method("tcp://10.1.1.20:23456")
    with pytest.raises(ValueError, match="init_method='abc://x': is not an init method"):
        ignite_options.init_method("abc://x")


def test_options_that_unirank_cannot_honour_are_named() -> None:
    with pytest.raises(TypeError, match=r"spawn\(\) got options unirank does not take: pg_opt"):
        ignite_options.take_init_timeout({"pg_opt": 1}, "spawn")
    with pytest.raises(ConfigError, match="join='False'"):
        ignite_options.take_spawn_options({"join": False})
    options: dict[str, Any] = {"start_method": "fork", "daemon": True, "join": True}
    with pytest.warns(UserWarning, match="start_method='fork' is ignored"):
        ignite_options.take_spawn_options(options)
    assert options == {}


def test_parallel_takes_ignite_s_options(serial: DistEnv) -> None:
    parallel = idist.Parallel(backend="gloo", init_method="env://", timeout=timedelta(seconds=9),
                              start_method="spawn")
    assert parallel.init_timeout == 9.0
    with pytest.raises(TypeError, match="Parallel"):
        idist.Parallel(backend="gloo", unknown=1)


def test_initialize_refuses_a_rank_the_launcher_contradicts(serial: DistEnv) -> None:
    with pytest.raises(ConfigError, match="rank='1'"):
        idist.initialize("gloo", rank=1)
    assert not idist.is_initialized()


def test_spawn_refuses_an_unknown_backend_before_starting_workers(serial: DistEnv) -> None:
    with pytest.raises(ConfigError, match="backend='nope'"):
        idist.spawn("nope", print, (), nproc_per_node=2)


def test_initialize_and_finalize_a_world_of_one(serial: DistEnv) -> None:
    idist.initialize("gloo", timeout=timedelta(seconds=30))
    try:
        assert idist.model_name() == "native-dist"
        assert idist.backend() == "gloo"
    finally:
        idist.finalize()
    assert idist.model_name() == "serial"


def test_set_local_rank_warns_and_applies_only_without_a_launcher(serial: DistEnv) -> None:
    with pytest.warns(DeprecationWarning, match="set_local_rank is deprecated"):
        idist.set_local_rank(3)
    assert idist.get_local_rank() == 3
    state.set_dist_env(DistEnv(launcher="torchrun", local_rank=1, local_world_size=2,
                               world_size=2, rank=1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idist.set_local_rank(0)
    assert idist.get_local_rank() == 1



def test_show_config_logs_ignite_s_lines_then_the_sources(
    serial: DistEnv, config_lines: list[str]
) -> None:
    state.set_dist_env(DistEnv(launcher="slurm", rank=0, world_size=2, local_world_size=1,
                               num_nodes=2, node_rank=0, node_name="n2",
                               sources={"rank": "SLURM_PROCID", "num_nodes": "SLURM_NNODES"}))
    idist.show_config()
    assert config_lines[:10] == [
        "distributed configuration: serial", "backend: None", "device: cpu",
        f"hostname: {idist.hostname()}", "world size: 2", "rank: 0", "local rank: 0",
        "num processes per_node: 1", "num nodes: 2", "node rank: 0",
    ]
    assert config_lines[10].startswith("launcher: slurm")
    assert "rank from: SLURM_PROCID" in config_lines
    assert "num nodes from: SLURM_NNODES" in config_lines
