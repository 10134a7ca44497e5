"""``supervisor.restartreason.restart_reason``: why an attempt ended, from its RunResult and the
plans before and after (pure): a lost or joined node named from the two rounds, a failed
worker's rank and exit code, the hang timeout, a requeue."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from unirank.exitcodes import HANG_TIMEOUT
from unirank.supervisor.plan import Plan, Worker
from unirank.supervisor.restartreason import evicted_node_ranks, restart_reason
from unirank.supervisor.summary import RunResult, WorkerExit


def _plan(*hosts: str) -> Plan:
    return Plan(mode="spawn", workers=(Worker(0, 0), Worker(1, 1)), world_size=2 * len(hosts),
                local_world_size=2, nnodes=len(hosts), node_rank=0, master_addr="127.0.0.1",
                master_port=1234, run_id="r", node_name=hosts[0], hosts=hosts)


def _exit(rank: int, code: int, error: str = "", lost_peer: bool = False) -> WorkerExit:
    return WorkerExit(rank=rank, local_rank=rank, node="nodeA", returncode=code, error=error,
                      lost_peer=lost_peer)


def test_a_world_change_with_a_node_gone_is_a_lost_node_named() -> None:
    result = RunResult((_exit(0, -15), _exit(1, -15)),
                       world_changed="node nodeB (127.0.1.1) is lost: no beat for 5 s")
    reason = restart_reason(result, _plan("nodeA", "nodeB"), _plan("nodeA"))
    assert (reason.kind, reason.lost_nodes, reason.joined_nodes) == ("node lost", ("nodeB",), ())
    assert reason.message == "node nodeB (127.0.1.1) is lost: no beat for 5 s"


def test_a_world_change_with_a_node_more_is_a_joined_node() -> None:
    result = RunResult((_exit(0, -15),), world_changed="1 node waiting to join")
    reason = restart_reason(result, _plan("nodeA"), _plan("nodeA", "nodeB"))
    assert (reason.kind, reason.joined_nodes) == ("node joined", ("nodeB",))


def test_a_world_change_with_the_same_nodes_again_is_said_as_such() -> None:
    result = RunResult((_exit(0, -15),), world_changed="node nodeB (x) is lost: no beat")
    reason = restart_reason(result, _plan("nodeA", "nodeB"), _plan("nodeA", "nodeB"))
    assert reason.kind == "world changed"


def test_a_failed_worker_gives_its_rank_node_and_exit_code() -> None:
    failed = _exit(1, 3, "SystemExit: 3")
    result = RunResult((_exit(0, 0), failed), first_failure=failed)
    reason = restart_reason(result, _plan("nodeA"), _plan("nodeA"))
    assert (reason.kind, reason.rank, reason.node, reason.exit_code) == (
        "worker failed", 1, "nodeA", 3)
    assert reason.message == "rank 1 on nodeA: exit code 3: SystemExit: 3"


def test_the_hang_timeout_s_exit_code_is_a_hang_timeout() -> None:
    hung = _exit(0, HANG_TIMEOUT)
    reason = restart_reason(RunResult((hung,), first_failure=hung), _plan("a"), _plan("a"))
    assert (reason.kind, reason.rank, reason.exit_code) == ("hang timeout", 0, HANG_TIMEOUT)


def test_workers_that_lost_their_peers_on_a_node_now_gone_blame_that_node() -> None:
    """A SIGKILLed node's workers die with it: the survivors' gloo fails at once (before the
    beat stalls), and the next round shows the node gone: the reason is the lost node."""
    peer = _exit(0, 1, "RuntimeError: [gloo] Connection closed by peer [127.0.1.1]:1234",
                 lost_peer=True)
    reason = restart_reason(RunResult((peer,), first_failure=peer), _plan("nodeA", "nodeB"),
                            _plan("nodeA"))
    assert (reason.kind, reason.lost_nodes, reason.rank) == ("node lost", ("nodeB",), None)


def test_a_worker_s_own_failure_is_not_blamed_on_a_node_gone_meanwhile() -> None:
    failed = _exit(1, 3, "ValueError: bad batch")
    reason = restart_reason(RunResult((failed,), first_failure=failed),
                            _plan("nodeA", "nodeB"), _plan("nodeA"))
    assert (reason.kind, reason.rank, reason.lost_nodes) == ("worker failed", 1, ("nodeB",))


def test_workers_stopped_to_be_requeued() -> None:
    result = RunResult((_exit(0, 79), _exit(1, 79)))
    assert restart_reason(result, _plan("a"), _plan("a")).kind == "requeued"


def test_the_wiring_s_reason_reaches_the_worker_and_an_outer_run_s_does_not() -> None:
    from unirank.supervisor.workerenv import WorkerWiring, worker_environ

    plan = _plan("nodeA")
    base = {"UNIRANK_RESTART_REASON": "an outer run's", "PATH": "/bin"}
    first = worker_environ(plan, plan.workers[0], base)
    assert "UNIRANK_RESTART_REASON" not in first
    value = restart_reason(RunResult((_exit(0, -15),), world_changed="x"), _plan("nodeA", "b"),
                           plan).to_value(1, 4)
    again = worker_environ(plan, plan.workers[0], base,
                           WorkerWiring(restart_count=1, restart_reason=value))
    assert again["UNIRANK_RESTART_REASON"] == value
    assert again["TORCHELASTIC_RESTART_COUNT"] == "1"


def test_lost_peer_is_read_once_from_the_whole_recorded_error(tmp_path: Path) -> None:
    """The error file's message says a peer went away in a line before its last: the engine
    (``RecordedFailure.lost_peer``), the restart reason and the ssh verdict all say lost peer
    (issue 33: the last two searched the last line only, and disagreed with the engine)."""
    from unirank.errorfile import read_failure
    from unirank.supervisor.ssh.remote import parse_verdict, verdict_line

    path = tmp_path / "error.json"
    path.write_text(json.dumps({"message": {"message": (
        "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer "
        "[127.0.1.1]:40123\nThe above exception was the direct cause of:\n"
        "DistBackendError: all_reduce failed"), "extraInfo": {"timestamp": "1"}}}))
    record = read_failure(path)
    assert record is not None and record.lost_peer
    assert record.message == "DistBackendError: all_reduce failed"
    peer = WorkerExit(rank=0, local_rank=0, node="nodeA", returncode=1, error=record.message,
                      lost_peer=record.lost_peer)
    reason = restart_reason(RunResult((peer,), first_failure=peer), _plan("nodeA", "nodeB"),
                            _plan("nodeA"))
    assert reason.kind == "node lost"
    assert parse_verdict(verdict_line(True, peer.lost_peer).strip().encode()) == (True, True)


def test_the_hang_timeout_with_a_node_gone_after_is_that_node_evicted() -> None:
    hung = _exit(0, HANG_TIMEOUT, "HangTimeoutError: rank 2 (nodeB) has not entered it")
    reason = restart_reason(RunResult((hung,), first_failure=hung), _plan("nodeA", "nodeB"),
                            _plan("nodeA"))
    assert (reason.kind, reason.lost_nodes) == ("node evicted", ("nodeB",))
    assert reason.message == "node evicted: nodeB (HangTimeoutError: rank 2 (nodeB) has not " \
        "entered it)"


def test_an_eviction_whose_node_a_spare_of_the_same_name_replaced_is_said_so() -> None:
    """``--on-slow replace``: the slow node left, a spare on a host of the same name came; no
    name left, yet the reason is the eviction (before: ``failed (rank 0: exit code 86)``,
    blaming the rank that waited)."""
    hung = _exit(0, HANG_TIMEOUT, "StragglerEvictedError: rank 1 kept the others waiting")
    why = "node evicted: rank 1 kept the others waiting 74 % of the time"
    reason = restart_reason(RunResult((hung,), first_failure=hung), _plan("vm", "vm"),
                            _plan("vm", "vm"), evicted=why)
    assert (reason.kind, reason.message) == ("node evicted", why)


def test_the_rendezvous_moved_is_said_so() -> None:
    result = RunResult((_exit(0, -15),), world_changed="store moved to node nodeB (10.0.0.2)",
                       world_change_kind="moved")
    reason = restart_reason(result, _plan("nodeA", "nodeB"), _plan("nodeB"))
    assert (reason.kind, reason.lost_nodes) == ("store moved", ("nodeA",))
    assert reason.message == "store moved to node nodeB (10.0.0.2)"
    # the kind is data: the same words with another kind are not a move
    other = restart_reason(replace(result, world_change_kind="lost"),
                           _plan("nodeA", "nodeB"), _plan("nodeB"))
    assert other.kind == "node lost"


def test_a_verdict_without_a_stuck_rank_leaves_nothing_to_evict() -> None:
    """``--on-hang evict`` after a hang no eviction can end (issue 40): one line says why,
    and the job ends instead of restarting into the same hang."""
    from unirank.hang.detect import AHEAD, ENDED, MISMATCH, NOT_ENTERED
    from unirank.supervisor.restartreason import nothing_to_evict

    def verdict(kind: str, blamed: list[int], stuck: list[int]) -> dict[str, object]:
        return {"never_entered": stuck, "call": "all_reduce #4", "blamed": blamed,
                "blame": kind}

    assert nothing_to_evict(verdict(MISMATCH, [1], [])) == (
        "--on-hang evict: nothing to evict: no rank is stuck, every rank waits: rank 1 called "
        "another collective or shape than the others; the job ends")
    assert nothing_to_evict(verdict(ENDED, [2, 3], [])) == (
        "--on-hang evict: nothing to evict: ranks 2-3 ended their program before "
        "all_reduce #4; the job ends")
    assert nothing_to_evict(verdict(AHEAD, [1], [])) == (
        "--on-hang evict: nothing to evict: no rank is stuck: rank 1 went on past "
        "all_reduce #4; the job ends")
    assert nothing_to_evict(verdict(NOT_ENTERED, [1], [1])) == ""  # its node is evicted
    assert nothing_to_evict(None) == "" and nothing_to_evict({}) == ""


def test_an_eviction_leaves_out_every_rank_of_the_nodes_that_run_the_verdict_s_ranks() -> None:
    hang = {"never_entered": [5], "call": "all_reduce #3"}
    assert evicted_node_ranks(hang, (4, 4)) == [4, 5, 6, 7]
    assert evicted_node_ranks({"slow": [0, 6], "straggler": 0}, (2, 3, 2)) == [0, 1, 5, 6]
    assert evicted_node_ranks(hang, ()) == [5]  # the layout not known: the verdict's ranks
    assert evicted_node_ranks(None, (4, 4)) == []
    assert evicted_node_ranks({"never_entered": []}, (4, 4)) == []
