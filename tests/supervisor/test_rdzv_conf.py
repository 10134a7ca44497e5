"""``--rdzv-conf``'s one parser (:func:`unirank.supervisor.rdzv.conf.parse_rdzv_conf`) and its
users: ``unirank run`` under the static and the dynamic rendezvous, ``unirank sbatch`` at
submission (pure: parsed options in, settings or a one-line ConfigError out)."""

from __future__ import annotations

import argparse

import pytest

from unirank.cli.run import add_arguments, build_request
from unirank.errors import ConfigError
from unirank.supervisor.rdzv.conf import KEYS, RdzvConf, parse_rdzv_conf


def test_defaults_are_fast_and_given_keys_are_recorded() -> None:
    assert parse_rdzv_conf(None) == RdzvConf()
    assert RdzvConf().lost_after == 3.0
    conf = parse_rdzv_conf("join_timeout=1.5, keep_alive_max_attempt=4,")
    assert (conf.join_timeout, conf.keep_alive_max_attempt) == (1.5, 4)
    assert conf.given == {"join_timeout", "keep_alive_max_attempt"}
    assert conf.last_call_timeout == RdzvConf().last_call_timeout


@pytest.mark.parametrize(("text", "line"), [
    ("join_timout=5", "--rdzv-conf='join_timout=5': is not a rendezvous setting unirank knows "
     "HINT: give K=V,... with K one of " + ", ".join(KEYS)),
    ("last_call_timeout", "--rdzv-conf='last_call_timeout': has no value"),
    ("last_call_timeout=soon", "--rdzv-conf last_call_timeout='soon': is not a number of "
     "seconds above 0"),
    ("keep_alive_max_attempt=1.5", "--rdzv-conf keep_alive_max_attempt='1.5': is not a whole "
     "number above 0"),
    ("close_timeout=0", "--rdzv-conf close_timeout='0': is not a number"),
    ("join_timeout=inf", "--rdzv-conf join_timeout='inf': is not a number"),
])
def test_a_bad_setting_is_one_line(text: str, line: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_rdzv_conf(text)
    assert str(caught.value).startswith(line)
    assert "\n" not in str(caught.value)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args([*argv, "train.py"])


STATIC = ("--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1")
DYNAMIC = ("--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:5")


@pytest.mark.parametrize("options", [STATIC, DYNAMIC])
def test_unirank_run_refuses_an_unknown_key_in_both_rendezvous(options: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError, match="is not a rendezvous setting unirank knows"):
        build_request(_args(*options, "--rdzv-conf", "join_timout=5"), {})


def test_the_static_rendezvous_takes_join_timeout_and_notes_the_others() -> None:
    notes: list[str] = []
    request = build_request(_args(*STATIC, "--rdzv-backend", "c10d", "--rdzv-conf",
                                  "join_timeout=1.5,last_call_timeout=2"), {}, notes)
    assert request.init_timeout == 1.5
    assert notes == ["--rdzv-conf last_call_timeout has no effect: node ranks are not "
                     "assigned at rendezvous here (c10d without --node-rank assigns them)"]


def test_the_dynamic_rendezvous_takes_every_key_without_a_note() -> None:
    notes: list[str] = []
    request = build_request(_args(*DYNAMIC, "--rdzv-conf", "join_timeout=1.5,"
                                  "last_call_timeout=2"), {}, notes)
    assert (request.init_timeout, request.nnodes, notes) == (1.5, None, [])


def test_torchrun_s_other_keys_are_accepted_and_recorded_apart() -> None:
    conf = parse_rdzv_conf("timeout=5,read_timeout=60,is_host=true,store_type=tcp,"
                           "last_call_timeout=2")
    assert conf.inert == {"timeout", "read_timeout", "is_host", "store_type"}
    assert (conf.given, conf.legacy_timeout) == ({"last_call_timeout"}, 5.0)
    assert conf.join_timeout == RdzvConf().join_timeout
    with pytest.raises(ConfigError, match=r"^--rdzv-conf timeout='soon': is not a number"):
        parse_rdzv_conf("timeout=soon")
    with pytest.raises(ConfigError, match=r"^--rdzv-conf read_timeout='0': is not a whole"):
        parse_rdzv_conf("read_timeout=0")


def test_quotes_around_the_whole_text_are_dropped() -> None:
    """torch's launcher test_launch_elastic gives ``--rdzv-conf='join_timeout=5,...'``."""
    conf = parse_rdzv_conf("'join_timeout=5,last_call_timeout=1,timeout=5'")
    assert (conf.join_timeout, conf.last_call_timeout, conf.legacy_timeout) == (5, 1, 5)
    assert parse_rdzv_conf('"close_timeout=2"').close_timeout == 2
    with pytest.raises(ConfigError, match="is not a rendezvous setting"):
        parse_rdzv_conf("'join_timeout=5")


_STORE_NOTE = ("--rdzv-conf {} has no effect: a setting of torch's c10d rendezvous store, "
               "which unirank's rendezvous does not keep")


def test_the_dynamic_rendezvous_notes_torchrun_s_legacy_timeout() -> None:
    """torch's launcher test_launch_elastic_multiple_agents gives ``timeout=5`` with c10d."""
    notes: list[str] = []
    request = build_request(_args(*DYNAMIC, "--rdzv-conf", "timeout=5,is_host=0"), {}, notes)
    assert request.init_timeout != 5
    assert notes == [_STORE_NOTE.format("is_host"), _STORE_NOTE.format("timeout")]


def test_the_static_rendezvous_takes_the_legacy_timeout_unless_join_timeout_is_given() -> None:
    notes: list[str] = []
    request = build_request(_args(*STATIC, "--rdzv-conf", "timeout=7"), {}, notes)
    assert (request.init_timeout, notes) == (7.0, [])
    request = build_request(_args(*STATIC, "--rdzv-conf", "timeout=7,join_timeout=2"), {},
                            notes)
    assert (request.init_timeout, notes) == (2.0, [_STORE_NOTE.format("timeout")])


def test_unirank_sbatch_refuses_a_typo_at_submission() -> None:
    from unirank.sbatch.spec import JobSpec, check_spec

    spec = JobSpec(program="train.py", nodes=2, min_nodes=1, launch="node",
                   rdzv_conf="last_call_timeout=5,keepalive=1")
    with pytest.raises(ConfigError, match="--rdzv-conf='keepalive=1': is not a rendezvous "
                       "setting unirank knows"):
        check_spec(spec)


def test_on_hang_defaults_to_evict_only_in_an_elastic_job_with_restarts_left() -> None:
    from unirank.contract import resolve_on_hang

    assert resolve_on_hang(None, {}, elastic=True, restarts=3) == "evict"
    assert resolve_on_hang(None, {}, elastic=True, restarts=0) == "exit"
    assert resolve_on_hang(None, {}, elastic=False, restarts=2) == "restart"
    assert resolve_on_hang(None, {}, elastic=False, restarts=0) == "exit"
    assert resolve_on_hang(None, {"UNIRANK_ON_HANG": "exit"}, elastic=True, restarts=3) == "exit"
    assert resolve_on_hang("Restart", {"UNIRANK_ON_HANG": "exit"}, elastic=True,
                           restarts=3) == "restart"
    with pytest.raises(ConfigError, match=r"^--on-hang='evict': needs an elastic job"):
        resolve_on_hang("evict", {}, elastic=False, restarts=3)
    with pytest.raises(ConfigError, match=r"^UNIRANK_ON_HANG='kill': is not what unirank does "
                       r"on a hang HINT: give one of exit, restart, evict"):
        resolve_on_hang(None, {"UNIRANK_ON_HANG": "kill"}, elastic=True, restarts=3)


def test_unirank_run_s_on_hang_follows_the_rendezvous() -> None:
    from unirank.cli.run import engine_options

    assert engine_options(_args(*DYNAMIC, "--max-restarts", "3"), {}).on_hang == "evict"
    assert engine_options(_args(*STATIC, "--max-restarts", "3"), {}).on_hang == "restart"
    with pytest.raises(ConfigError, match="--on-hang='evict': needs an elastic job"):
        engine_options(_args(*STATIC, "--on-hang", "evict"), {})


def test_a_node_fences_itself_before_the_server_declares_it_lost() -> None:
    """One world at every moment: the side that lost its server stops its workers before the
    other side's server declares it lost, whatever the beat settings; a successor holds its
    first round past the server's declaration."""
    from unirank.supervisor.rdzv.conf import fence_after, lost_after, successor_hold

    assert (fence_after(1.0, 3), lost_after(1.0, 3), successor_hold(1.0, 3)) == (2.5, 3.0, 1.5)
    for interval in (0.1, 1.0, 5.0):
        for attempts in (1, 2, 3, 10):
            fence, lost = fence_after(interval, attempts), lost_after(interval, attempts)
            assert 0 < fence < lost
            assert fence + successor_hold(interval, attempts) > lost


def test_the_rendezvous_waits_have_one_home_and_the_docs_say_its_values() -> None:
    """Each wait of the rendezvous is derived from the beat settings in ``conf`` (the spec's
    defaults are the conf's), longer waits follow shorter ones, and the sentences of the docs
    that give them say what the code does."""
    from pathlib import Path

    from unirank.supervisor.rdzv import conf as rconf
    from unirank.supervisor.rdzv.spec import RdzvSpec

    spec = RdzvSpec(endpoint_host="h", endpoint_port=1, run_id="j", min_nodes=1, max_nodes=2,
                    local_addr="a", node_name="n", nproc=1, serves_endpoint=False)
    default = rconf.RdzvConf()
    assert (spec.keep_alive_interval, spec.keep_alive_max_attempt, spec.join_timeout) == \
        (default.keep_alive_interval, default.keep_alive_max_attempt, default.join_timeout)
    assert spec.fence_after < spec.lost_after < spec.reconnect_within < spec.resume_grace
    interval, attempts = default.keep_alive_interval, default.keep_alive_max_attempt
    lost, fence = spec.lost_after, spec.fence_after
    docs = Path(__file__).resolve().parents[2] / "docs"
    run, slurm = (docs / "run.md").read_text(), (docs / "slurm-jobs.md").read_text()
    for said in (f"({attempts}: a node silent for {lost:g} s is lost)",
                 f"after {lost:g} s without a beat",
                 f"for {fence:g} s (half a beat less than the {lost:g} s",
                 f"beats {interval:g} s x {attempts}"):
        assert said in " ".join(run.split()), said
    assert f"no beat for {lost:g} s" in " ".join(slurm.split())
