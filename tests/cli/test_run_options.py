"""``unirank run``'s option table (pure): torchrun's ``PET_*`` defaults, and the torchrun
behaviours decided from the options (``auto``, ``--rdzv-endpoint HOST:0``, ``--logs-specs``,
the grace period, the signals, tee over redirects, the tee prefix). Every test passes its
environment as a dict."""

from __future__ import annotations

import argparse
import os
import signal

import pytest

from unirank.cli.run import add_arguments, build_request, engine_options
from unirank.cli.runoptions import OPTIONS, describe_sources, settle
from unirank.errors import ConfigError


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args([*argv, "x.py"])


def _torch_pet_names() -> dict[str, bool]:
    """torch 2.13's launcher: PET_<DEST> -> whether it is a flag, for every option read from
    the environment (``argparse_util.env`` / ``check_env``)."""
    from torch.distributed.argparse_util import check_env, env
    from torch.distributed.run import get_args_parser

    return {f"PET_{a.dest.upper()}": isinstance(a, check_env)
            for a in get_args_parser()._actions if isinstance(a, (env, check_env))}


def test_every_torchrun_option_reads_the_pet_variable_torchrun_reads() -> None:
    ours = {o.variable: o.flag for o in OPTIONS if o.variable is not None}
    assert ours == _torch_pet_names()


def test_the_command_line_wins_over_pet() -> None:
    env = {"PET_NPROC_PER_NODE": "3"}
    assert build_request(_args("--nproc-per-node", "1"), env).nproc_per_node == 1
    assert build_request(_args("--nproc_per_node=1"), env).nproc_per_node == 1
    assert build_request(_args("-n", "1"), env).nproc_per_node == 1
    assert build_request(_args(), env).nproc_per_node == 3


def test_kubeflow_s_variables_make_the_request_of_the_options() -> None:
    env = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "1",
           "PET_MASTER_ADDR": "trainer-node-0", "PET_MASTER_PORT": "29400"}
    request = build_request(_args(), env)
    assert (request.nnodes, request.nproc_per_node, request.node_rank, request.master_addr,
            request.master_port) == (2, 2, 1, "trainer-node-0", 29400)
    assert request == build_request(
        _args("--nnodes", "2", "--nproc-per-node", "2", "--node-rank", "1", "--master-addr",
              "trainer-node-0", "--master-port", "29400"), {})


def test_the_first_line_says_which_values_came_from_the_environment() -> None:
    args = _args("--nnodes", "2")
    settle(args, {"PET_NNODES": "3", "PET_NPROC_PER_NODE": "2", "PET_STANDALONE": "1",
                  "PET_ROLE": "trainer"})
    assert describe_sources(args) == (
        "from the environment: --nproc-per-node 2 (PET_NPROC_PER_NODE), --standalone "
        "(PET_STANDALONE), --role trainer (PET_ROLE)")
    assert describe_sources(_args()) is None


@pytest.mark.parametrize(("text", "on"), [("1", True), ("0", False), ("2", True)])
def test_a_flag_s_pet_value_is_an_integer_as_torchrun_s(text: str, on: bool) -> None:
    args = _args()
    settle(args, {"PET_STANDALONE": text, "PET_MODULE": text, "PET_NO_PYTHON": "0"})
    assert (args.standalone, args.module, args.no_python) == (on, on, False)


def test_bad_pet_values_are_reported_under_the_variable_s_name() -> None:
    with pytest.raises(ConfigError, match=r"^PET_STANDALONE='yes': is not an integer"):
        settle(_args(), {"PET_STANDALONE": "yes"})
    with pytest.raises(ConfigError, match=r"^PET_MAX_RESTARTS='x': is not an integer"):
        build_request(_args(), {"PET_MAX_RESTARTS": "x"})
    with pytest.raises(ConfigError, match=r"^PET_TEE='9'"):
        engine_options(_args(), {"PET_TEE": "9"})
    with pytest.raises(ConfigError, match=r"^--max-restarts='x'"):  # given: its own name
        build_request(_args("--max-restarts", "x"), {"PET_MAX_RESTARTS": "1"})


def test_options_torchrun_reads_only_from_its_command_line_ignore_pet() -> None:
    args = _args()
    settle(args, {"PET_LOGS_SPECS": "x", "PET_NUMA_BINDING": "node", "PET_INIT_TIMEOUT": "1"})
    assert (args.logs_specs, args.numa_binding, args.init_timeout) == (None, None, None)


def test_explicit_auto_without_gpus_is_one_worker_per_cpu_as_torchrun() -> None:
    no_gpu = {"CUDA_VISIBLE_DEVICES": ""}
    request = build_request(_args("--nproc-per-node", "auto"), no_gpu)
    assert request.spawn_default == max(1, os.cpu_count() or 1)
    assert request.nproc_per_node is None  # still "leave it to an outer launcher"
    assert build_request(_args(), no_gpu).spawn_default == 1  # not given: unirank's one
    assert build_request(_args("-n", "auto"), {**no_gpu, "CUDA_VISIBLE_DEVICES": "0,1"}
                         ).spawn_default == 2


def test_rdzv_endpoint_port_0_is_a_free_port_and_errors_quote_the_value() -> None:
    request = build_request(_args("--rdzv-endpoint", "localhost:0"), {})
    assert (request.master_addr, request.master_port) == ("localhost", None)
    with pytest.raises(ConfigError, match=r"^--rdzv-endpoint='localhost:x': has no port"):
        build_request(_args("--rdzv-endpoint", "localhost:x"), {})


def test_an_unknown_logs_specs_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^--logs-specs='DOESNOT_EXIST': is no installed"):
        build_request(_args("--logs-specs=DOESNOT_EXIST"), {})


def test_grace_period_is_torchrun_s_30_s_or_its_variable() -> None:
    assert engine_options(_args(), {}).grace_period == 30
    assert engine_options(_args(), {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "7"}).grace_period == 7
    assert engine_options(_args("--shutdown-timeout", "2"),
                          {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "7"}).grace_period == 2
    assert engine_options(_args(), {"PET_SHUTDOWN_TIMEOUT": "3"}).grace_period == 3
    with pytest.raises(ConfigError, match="^TORCH_ELASTIC_SHUTDOWN_TIMEOUT='x'"):
        engine_options(_args(), {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "x"})


def test_default_signals_are_torchrun_s_plus_the_ranks_stop_signals() -> None:
    options = engine_options(_args(), {})
    assert options.signals_to_handle == "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    assert options.signals == (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                               signal.SIGUSR1, signal.SIGUSR2)
    given = engine_options(_args("--signals-to-handle", "SIGUSR1"), {})
    assert (given.signals, given.signals_to_handle) == ((signal.SIGUSR1,), "SIGUSR1")
    from_pet = engine_options(_args(), {"PET_SIGNALS_TO_HANDLE": "SIGTERM"})
    assert from_pet.signals == (signal.SIGTERM,)


def test_tee_wins_over_redirects_and_teed_console_lines_get_torchrun_s_prefix() -> None:
    out = engine_options(_args("--redirects", "3", "--tee", "3"), {}).output
    assert not out.redirected(0, 1) and not out.redirected(0, 2)
    assert out.tee_prefix(5, 1, "default") == b"[default1]:"
    templated = engine_options(
        _args("--tee", "1"),
        {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "<${role_name}|${rank}|${local_rank}>"}
    ).output
    assert templated.tee_prefix(3, 1, "trainer") == b"<trainer|3|1>"
    assert engine_options(_args(), {}).output.tee_prefix(0, 0, "default") is None



ELASTIC = ("--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29400")


@pytest.mark.parametrize(("argv", "environ", "restarts"), [
    ((), {}, 0),                                      # torchrun's default
    (("--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1"), {}, 0),  # static
    (ELASTIC, {}, 3),                                 # a range: the elastic default
    ((*ELASTIC, "--max-restarts", "0"), {}, 0),       # as given
    (ELASTIC, {"PET_MAX_RESTARTS": "1"}, 1),
])
def test_an_elastic_range_gets_the_one_elastic_default(argv: tuple[str, ...],
                                                       environ: dict[str, str],
                                                       restarts: int) -> None:
    """``unirank run --nnodes 1:2`` (each host of ``--hosts`` runs it too) and ``unirank sbatch
    --nnodes 1:2`` get the same --max-restarts: contract.default_max_restarts."""
    from unirank.contract import ELASTIC_MAX_RESTARTS
    from unirank.sbatch.spec import JobSpec

    assert build_request(_args(*argv), environ).max_restarts == restarts
    assert JobSpec("x.py", nodes=2, min_nodes=1).restarts() == ELASTIC_MAX_RESTARTS == 3


def test_preload_given_twice_adds_up() -> None:
    """``--preload numpy --preload a,b``: every module named, in order (argparse's store kept
    only the last); other options given twice still keep the last, as torchrun's."""
    from unirank.cli.runconfig import preload

    args = _args("--preload", "numpy", "--preload", "a,b", "--role", "x", "--role", "y")
    assert preload(args.preload, no_preload=False) == ("numpy", "a", "b")
    assert args.role == "y"
