"""A restart's story, pure (milliseconds each): when the restart's line is said
(:func:`~unirank.supervisor.recovery.restart_line_waits`), the recovery's ``--timeline`` rows
(golden file ``fixtures/timeline/recovery.txt``; ``UNIRANK_REGEN_GOLDEN=1`` writes it), the
words of an eviction (:func:`~unirank.supervisor.restartreason.evicted_why`), the restart
reason and the failure summary's attempt line that say them, and the ``on_hang=`` keyword's
decision (:func:`unirank.contract.on_hang_now`) and parser (errors name the keyword).

Reads ``UNIRANK_REGEN_GOLDEN`` (the golden file's regeneration) only.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from unirank.contract import ELASTIC_VAR, on_hang_now
from unirank.elasticstate import RestartReason
from unirank.errors import ConfigError
from unirank.exitcodes import HANG_TIMEOUT
from unirank.runfolder import AttemptFolder
from unirank.supervisor.plan import Plan, Worker
from unirank.supervisor.recovery import Recovery, format_recovery, restart_line_waits
from unirank.supervisor.restartreason import evicted_why, restart_reason
from unirank.supervisor.summary import RunResult, WorkerExit, format_summary

GOLDEN = Path(__file__).resolve().parent.parent / "fixtures" / "timeline"


def _plan(*hosts: str) -> Plan:
    return Plan(mode="spawn", workers=(Worker(0, 0),), world_size=len(hosts),
                local_world_size=1, nnodes=len(hosts), node_rank=0, master_addr="127.0.0.1",
                master_port=1234, run_id="r", node_name=hosts[0], hosts=hosts)


def _exit(rank: int, code: int, error: str = "", lost_peer: bool = False) -> WorkerExit:
    return WorkerExit(rank=rank, local_rank=0, node="nodeA", returncode=code, error=error,
                      lost_peer=lost_peer)


# -- when the restart's line is said -------------------------------------------------------
@pytest.mark.parametrize(("on_hang", "hang_ended", "changed", "waits"), [
    ("evict", True, None, True),       # this node's rank may be the one evicted
    ("evict", False, "node evicted: rank 1 never entered all_reduce #6", True),
    ("evict", False, "node b (x) is lost: its connection closed", True),
    ("evict", False, None, False),     # a worker failed: said at once
    ("restart", True, None, False),    # no eviction: said at once
    ("exit", False, "node b is lost", False),
])
def test_the_restart_line_waits_only_where_this_node_may_be_evicted(
        on_hang: str, hang_ended: bool, changed: str | None, waits: bool) -> None:
    assert restart_line_waits(on_hang, hang_ended, changed) is waits


# -- the recovery's timeline rows ----------------------------------------------------------
def test_the_recovery_s_rows_read_as_the_golden_file() -> None:
    """The news at t=100: the workers stopped 12 ms later, the round closed at 20 ms, the two
    ranks' workers started and ran their first collective (rank 1 the slowest); rank 2 never
    reported times."""
    recovery = Recovery("node lost: nodeB", 1, noticed=100.0, stopped=100.012,
                        rendezvous=100.020)
    records = [{"rank": 0, "node": "nodeA", "times": {"started": 100.031,
                                                      "first_collective": 101.234}},
               {"rank": 1, "node": "nodeA", "times": {"started": 100.032,
                                                      "first_collective": 101.5}},
               {"rank": 2, "node": "nodeC"}]
    text = format_recovery(recovery, records)
    path = GOLDEN / "recovery.txt"
    if os.environ.get("UNIRANK_REGEN_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with UNIRANK_REGEN_GOLDEN=1"
    assert text == path.read_text()


def test_a_recovery_without_rendezvous_or_times_says_what_was_not_seen() -> None:
    text = format_recovery(Recovery("worker failed: rank 0", 2, 5.0, 5.5), [])
    assert "rendezvous closed" not in text
    assert "  workers stopped                0.500\n" in text
    assert "first collective done" in text and "(not seen)" in text
    assert text.startswith("unirank run: recovery before attempt 2 (worker failed: rank 0)")


# -- the words of an eviction ----------------------------------------------------------------
def test_an_eviction_names_the_ranks_that_never_entered_the_collective() -> None:
    assert evicted_why({"never_entered": [1], "call": "all_reduce #6"}) == \
        "node evicted: rank 1 never entered all_reduce #6"
    assert evicted_why({"never_entered": [0, 3], "call": ""}) == (
        "node evicted: rank 0 never entered the collective; rank 3 never entered the "
        "collective")
    assert evicted_why({"never_entered": []}) == ""
    assert evicted_why(None) == ""


def test_the_evicting_node_s_reason_is_the_eviction_however_the_attempt_ended() -> None:
    """The evicted node asked for a new round first (its blamed rank exited first): the
    attempt ended as a world change, but the reason is the eviction, in its words."""
    result = RunResult((_exit(0, -15),), world_changed="node nodeB asked for a new round")
    why = "node evicted: rank 1 never entered all_reduce #6"
    reason = restart_reason(result, _plan("nodeA", "nodeB"), _plan("nodeA"), why)
    assert (reason.kind, reason.message, reason.lost_nodes) == ("node evicted", why,
                                                                ("nodeB",))
    assert reason.headline() == why
    assert reason.describe() == why
    without = restart_reason(result, _plan("nodeA", "nodeB"), _plan("nodeA"))
    assert without.kind == "node lost"  # no verdict here: only that the node left


def test_a_node_told_of_an_eviction_while_its_workers_ran_says_it() -> None:
    why = "node evicted: rank 0 never entered all_reduce #3"
    reason = restart_reason(RunResult((_exit(0, -15),), world_changed=why,
                                      world_change_kind="evicted"),
                            _plan("nodeA", "nodeB"), _plan("nodeB"))
    assert (reason.kind, reason.headline()) == ("node evicted", why)


def test_a_moved_rendezvous_is_the_reason_also_where_a_worker_lost_its_peers_first() -> None:
    """The endpoint's node killed: gloo may fail a worker here before the news came; the
    rendezvous's news that it moved still says what happened."""
    failed = _exit(0, 1, "RuntimeError: Connection closed by peer", lost_peer=True)
    moved = "store moved to node nodeB (10.0.0.2)"
    reason = restart_reason(RunResult((failed,), first_failure=failed),
                            _plan("nodeA", "nodeB"), _plan("nodeB"), "", moved)
    assert (reason.kind, reason.headline(), reason.lost_nodes) == ("store moved", moved,
                                                                   ("nodeA",))
    assert restart_reason(RunResult((failed,), first_failure=failed), _plan("nodeA", "nodeB"),
                          _plan("nodeB")).kind == "node lost"


def test_headlines_of_node_changes_and_none_for_other_kinds() -> None:
    assert RestartReason("node lost", "node b (x) is lost", ("b",)).headline() == \
        "node lost: b"
    moved = "store moved to node b (10.0.0.2)"
    assert RestartReason("store moved", moved, ("a",)).headline() == moved
    assert RestartReason("worker failed", "rank 1 ...", rank=1).headline() is None
    assert RestartReason("node joined", "", (), ("c",)).headline() is None


def test_the_summary_s_attempt_line_says_the_node_change_first() -> None:
    failed = _exit(0, 1, "RuntimeError: Connection closed by peer", lost_peer=True)
    lost = RunResult((failed,), first_failure=failed, nodes_changed="node lost: nodeB")
    evicted = RunResult((_exit(0, -15),), world_changed="node nodeB asked for a new round",
                        nodes_changed="node evicted: rank 1 never entered all_reduce #6")
    moved = "store moved to node nodeB (10.0.0.2)"
    same = RunResult((_exit(0, -15),), world_changed=moved, nodes_changed=moved)
    text = format_summary(RunResult((_exit(0, 0),), attempts=(lost, evicted, same)))
    assert text.splitlines() == [
        "unirank run: succeeded after 3 restarts",
        "  attempt 0: node lost: nodeB (rank 0 (local rank 0) on node nodeA: exit code 1: "
        "RuntimeError: Connection closed by peer)",
        "  attempt 1: node evicted: rank 1 never entered all_reduce #6 (node nodeB asked for "
        "a new round)",
        f"  attempt 2: {moved}"]


def test_a_hang_timeout_without_a_node_change_keeps_its_line() -> None:
    hung = _exit(0, HANG_TIMEOUT, "HangTimeoutError: no progress")
    text = format_summary(RunResult((_exit(0, 0),), attempts=(
        RunResult((hung,), first_failure=hung),)))
    assert "  attempt 0: rank 0 (local rank 0) on node nodeA: " in text


# -- the on_hang= keyword ------------------------------------------------------------------
@pytest.mark.parametrize(("configured", "asked", "now"), [
    ("restart", "exit\n", "exit"),      # the program's keyword wins
    ("evict", "restart\n", "restart"),
    ("exit", None, "exit"),             # no keyword: --on-hang / UNIRANK_ON_HANG / default
    ("restart", "", "restart"),         # a file cut short: ignored
    ("restart", "bogus", "restart"),
])
def test_the_program_s_on_hang_wins_over_the_supervisor_s(configured: str, asked: str | None,
                                                          now: str) -> None:
    assert on_hang_now(configured, asked) == now


def test_init_s_on_hang_is_written_in_the_attempt_folder(tmp_path: Path) -> None:
    from unirank.runtime.lifecycle import ask_on_hang

    ask_on_hang(" Exit ", {"UNIRANK_ATTEMPT_DIR": str(tmp_path)})
    assert Path(AttemptFolder(str(tmp_path)).on_hang_asked).read_text() == "exit\n"
    ask_on_hang("evict", {"UNIRANK_ATTEMPT_DIR": str(tmp_path), ELASTIC_VAR: "1"})
    assert Path(AttemptFolder(str(tmp_path)).on_hang_asked).read_text() == "evict\n"
    ask_on_hang(None, {"UNIRANK_ATTEMPT_DIR": str(tmp_path)})  # not given: left alone
    assert Path(AttemptFolder(str(tmp_path)).on_hang_asked).read_text() == "evict\n"
    ask_on_hang("restart", {})  # no unirank supervisor: nothing to write, no error


@pytest.mark.parametrize(("value", "environ", "words"), [
    ("sometimes", {}, "is not what unirank does on a hang"),
    ("evict", {}, "needs an elastic job"),
])
def test_a_bad_on_hang_keyword_is_one_line_naming_the_keyword(
        value: str, environ: dict[str, str], words: str, tmp_path: Path) -> None:
    from unirank.runtime.lifecycle import ask_on_hang

    with pytest.raises(ConfigError) as caught:
        ask_on_hang(value, {**environ, "UNIRANK_ATTEMPT_DIR": str(tmp_path)})
    assert (caught.value.variable, caught.value.value) == ("on_hang", value)
    assert words in caught.value.message
    assert not Path(AttemptFolder(str(tmp_path)).on_hang_asked).exists()


def test_parallel_and_launch_refuse_a_bad_on_hang_before_any_worker() -> None:
    import unirank as ur

    with pytest.raises(ConfigError) as caught:
        ur.Parallel("gloo", nproc_per_node=2, on_hang="later")
    assert caught.value.variable == "on_hang"
    ur.Parallel("gloo", nproc_per_node=2, on_hang="evict")  # in place, elastic: init decides
    with pytest.raises(ConfigError) as caught:  # spawned workers form a static world
        ur.launch(print, nproc_per_node=2, on_hang="evict")
    assert (caught.value.variable, caught.value.value) == ("on_hang", "evict")
    assert "needs an elastic job" in caught.value.message
