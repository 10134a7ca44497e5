"""``unirank doctor``'s checks as pure functions of gathered facts: each FAIL and WARN provoked,
with its status and exact hint asserted (no network, no torch)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from unirank.distenv import DistEnv
from unirank.doctor import checks
from unirank.doctor.facts import Facts, Versions, expected_world
from unirank.doctor.groupchecks import RankReport, group_checks, join_failed
from unirank.doctor.netinfo import Lookup
from unirank.doctor.result import FAIL, OK, SKIP, WARN, Check, format_table, merge, to_json
from unirank.errors import ConfigError
from unirank.joincheck import InitTimeoutError

VERSIONS = Versions("3.11.7", "0.1.0", "2.13.0", None)
CUDA = Versions("3.11.7", "0.1.0", "2.13.0", "12.4")
IFACES = {"lo": ("127.0.0.1",), "eth0": ("10.0.0.5",), "docker0": ("172.17.0.1",)}


def facts(**changes: Any) -> Facts:
    """Healthy facts of rank 0 of a 2-rank slurm job whose master is another node."""
    base = Facts(
        env=DistEnv("slurm", world_size=2, num_nodes=2, master_addr="node1",
                    master_port=29500, node_name="node2", hosts=("node1", "node2")),
        env_error=None, backend="auto", spawn=None, gpus=0, cuda_visible=None,
        expected_tasks=("SLURM_STEP_NUM_TASKS", 2),
        master=Lookup("node1", ("10.0.0.1",), "", 0.001),
        serves=False, agent_store=False, port_free=None, port_owner=None, ephemeral=(32768, 60999),
        probe="refused", interfaces=IFACES, route_ip="10.0.0.5",
        reverse=(Lookup("10.0.0.1", ("node1",), "", 0.002),
                 Lookup("::ffff:10.0.0.1", ("node1",), "", 0.003)),
        versions=VERSIONS, node="node2",
    )
    return dataclasses.replace(base, **changes)


def row(rows: list[Check], name: str) -> Check:
    found = [r for r in rows if r.name == name]
    assert len(found) == 1, rows
    return found[0]


def test_healthy_facts_pass_every_check() -> None:
    rows = checks.local_checks(facts())
    assert [r.status for r in rows] == [OK] * len(rows), rows
    assert {r.name for r in rows} >= {"launcher", "world size", "gpus", "torch",
                                      "master address", "master reachable", "master port",
                                      "route to master", "reverse lookup"}


def test_allocation_shell_without_srun_fails() -> None:
    env = DistEnv("slurm-allocation", world_size=1, num_nodes=1, launch_required=True,
                  planned_tasks=2)
    check = row(checks.local_checks(facts(env=env, expected_tasks=None)), "launcher")
    assert check.status == FAIL
    assert check.hint == "start the tasks with: srun unirank doctor (and srun your script)"


def test_detection_error_is_the_launcher_row() -> None:
    error = ConfigError("is not a number", variable="RANK", value="x", hint="export RANK=<int>")
    rows = checks.local_checks(facts(env=None, env_error=error, master=None, reverse=()))
    check = row(rows, "launcher")
    assert (check.status, check.hint) == (FAIL, "export RANK=<int>")
    assert "RANK='x'" in check.detail


def test_every_node_a_world_of_one_fails() -> None:
    env = DistEnv("local", world_size=1, master_addr="127.0.0.1")
    check = row(checks.local_checks(facts(env=env)), "world size")
    assert check.status == FAIL
    assert check.hint == ("export UNIRANK_LAUNCHER=<the launcher that started the tasks> "
                          "(e.g. slurm), or unset stale RANK/WORLD_SIZE variables")


def test_expected_world_reads_the_step_only_inside_a_step() -> None:
    assert expected_world({"SLURM_STEP_NUM_TASKS": "4"}) is None
    assert expected_world({"SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_ID": "0"}) == (
        "SLURM_STEP_NUM_TASKS", 4)
    assert expected_world({"OMPI_COMM_WORLD_SIZE": "3"}) == ("OMPI_COMM_WORLD_SIZE", 3)


def test_expected_world_knows_a_step_by_its_older_variable_too() -> None:
    """SLURM_STEPID alone (the older spelling) is a step, as for the launcher's detection."""
    assert expected_world({"SLURM_STEP_NUM_TASKS": "4", "SLURM_STEPID": "0"}) == (
        "SLURM_STEP_NUM_TASKS", 4)


def test_nccl_without_a_cuda_build_fails() -> None:
    check = row(checks.local_checks(facts(backend="nccl")), "gpus")
    assert check.status == FAIL
    assert check.hint == ("--backend gloo, or request GPUs: srun --gpus-per-task=1 "
                          "(or check CUDA_VISIBLE_DEVICES)")


def test_nccl_with_fewer_gpus_than_local_ranks_fails() -> None:
    env = DistEnv("slurm", world_size=4, local_world_size=4, master_addr="node1")
    check = row(checks.local_checks(facts(env=env, backend="nccl", gpus=2, versions=CUDA,
                                          expected_tasks=None)), "gpus")
    assert check.status == FAIL
    assert check.hint == "--ntasks-per-node=2 (or -n 2), or --backend gloo"
    ok = row(checks.local_checks(facts(env=env, backend="nccl", gpus=4, versions=CUDA,
                                       expected_tasks=None)), "gpus")
    assert ok.status == OK


def test_unresolvable_master_fails() -> None:
    lookup = Lookup("no.such.host.invalid", None, "Name or service not known", 0.01)
    check = row(checks.local_checks(facts(master=lookup, reverse=(), probe=None)),
                "master address")
    assert check.status == FAIL
    assert "'no.such.host.invalid'" in check.detail
    assert check.hint == ("export MASTER_ADDR=<a host name or address every node resolves, "
                          "e.g. the first node's>")


def test_unreachable_master_fails() -> None:
    check = row(checks.local_checks(facts(probe="timeout")), "master reachable")
    assert check.status == FAIL
    assert check.hint.startswith("open MASTER_PORT in the firewall")


def test_taken_port_names_its_owner() -> None:
    rows = checks.local_checks(facts(serves=True, port_free=False, port_owner="pid 7 (nc)"))
    check = row(rows, "master port")
    assert (check.status, check.detail) == (FAIL, "29500 is already in use on this host, by "
                                                  "pid 7 (nc)")
    assert check.hint == "export MASTER_PORT=<a free port, the same on every rank>"


def test_ephemeral_port_warns() -> None:
    env = DistEnv("slurm", world_size=2, num_nodes=2, master_addr="node1", master_port=40000)
    check = row(checks.local_checks(facts(env=env)), "master port")
    assert check.status == WARN
    assert check.hint == "export MASTER_PORT=<a port below 32768, e.g. 29500>"
    bound = row(checks.local_checks(facts(env=env, agent_store=True)), "master port")
    assert bound.status == OK  # the agent (torchrun's, unirank run's) already holds it


@pytest.mark.parametrize(("spec", "picked"), [
    ("eth", ["eth0"]), ("=eth", []), ("=eth0", ["eth0"]), ("^docker,lo", ["eth0"]),
    ("^=eth0", ["docker0", "lo"]), ("ib", []),
])
def test_ifname_matches_follows_nccl_syntax(spec: str, picked: list[str]) -> None:
    assert checks.ifname_matches(spec, sorted(IFACES)) == picked


def test_bad_interface_names_fail_with_the_routing_interface() -> None:
    rows = checks.local_checks(facts(ifname_vars={"GLOO_SOCKET_IFNAME": "nosuch0",
                                                  "NCCL_SOCKET_IFNAME": "ib"}))
    gloo, nccl = row(rows, "GLOO_SOCKET_IFNAME"), row(rows, "NCCL_SOCKET_IFNAME")
    assert (gloo.status, gloo.hint) == (FAIL, "export GLOO_SOCKET_IFNAME=eth0")
    assert (nccl.status, nccl.hint) == (FAIL, "export NCCL_SOCKET_IFNAME=eth0")
    ok = checks.local_checks(facts(ifname_vars={"NCCL_SOCKET_IFNAME": "^docker,lo"}))
    assert row(ok, "NCCL_SOCKET_IFNAME").status == OK


def test_route_through_docker_warns_that_nccl_leaves_it_out() -> None:
    check = row(checks.local_checks(facts(route_ip="172.17.0.1")), "route to master")
    assert (check.status, check.hint) == (WARN, "export NCCL_SOCKET_IFNAME=docker0")


def test_an_ipv6_route_names_its_interface() -> None:
    ifaces = {**IFACES, "eth0": ("10.0.0.5", "fd00::5", "fe80::5")}
    rows = checks.local_checks(facts(
        master=Lookup("node1", ("fd00::1",), "", 0.001), interfaces=ifaces, route_ip="fd00::5",
        ifname_vars={"GLOO_SOCKET_IFNAME": "ib0"}))
    assert row(rows, "route to master") == Check(
        "route to master", OK, "eth0 (fd00::5) routes to fd00::1")
    assert row(rows, "GLOO_SOCKET_IFNAME").hint == "export GLOO_SOCKET_IFNAME=eth0"


def test_no_route_fails() -> None:
    check = row(checks.local_checks(facts(route_ip=None)), "route to master")
    assert check.status == FAIL


def test_slow_reverse_lookup_suggests_the_hosts_line() -> None:
    slow = (Lookup("10.0.0.1", ("node1",), "", 0.01),
            Lookup("::ffff:10.0.0.1", None, "no answer within 3 s", 3.0))
    check = row(checks.local_checks(facts(reverse=slow)), "reverse lookup")
    assert check.status == WARN
    assert check.hint == "add the line '10.0.0.1 node1' to /etc/hosts on every node"


def test_missing_torch_fails() -> None:
    check = row(checks.local_checks(facts(versions=Versions("3.11.7", "0.1.0", None, None))),
                "torch")
    assert (check.status, check.hint) == (FAIL, "pip install torch")


def report(rank: int, node: str, **changes: Any) -> RankReport:
    base = RankReport(rank=rank, node=node, checks=(), master=("10.0.0.1",),
                      versions=VERSIONS, gpu=None, clock=1000.0)
    return dataclasses.replace(base, **changes)


def gchecks(reports: list[RankReport], backend: str = "auto",
            nodes: tuple[str, ...] = ("node1", "node2")) -> list[Check]:
    return group_checks(reports, expected_nodes=nodes, backend=backend, seconds=1.0)


def test_healthy_group_passes() -> None:
    rows = gchecks([report(0, "node1"), report(1, "node2")])
    assert [r.status for r in rows] == [OK] * 5, rows


def test_two_ranks_on_one_gpu_fail_with_nccl() -> None:
    reports = [report(0, "node1", gpu="0"), report(1, "node1", gpu="0"),
               report(2, "node2", gpu="0")]
    check = row(gchecks(reports, "nccl"), "gpu binding")
    assert check.status == FAIL
    assert "GPU 0 on node1: rank 0 (node1), rank 1 (node1)" in check.detail
    assert check.hint == ("give each task its own GPU: srun --gpus-per-task=1 (or "
                          "--ntasks-per-node=<GPUs per node>), or --backend gloo")
    assert row(gchecks(reports, "gloo"), "gpu binding").status == WARN


def test_master_resolving_differently_fails() -> None:
    check = row(gchecks([report(0, "node1"), report(1, "node2", master=("127.0.1.1",))]),
                "same master")
    assert check.status == FAIL
    assert check.hint == ("export MASTER_ADDR=<the first node's IP address> (the same on "
                          "every rank)")


def test_version_mismatch_fails() -> None:
    other = Versions("3.11.7", "0.1.0", "2.12.0", None)
    check = row(gchecks([report(0, "node1"), report(1, "node2", versions=other)]),
                "same versions")
    assert check.status == FAIL
    assert "rank 1 (node2)" in check.detail


def test_clock_skew_warns() -> None:
    check = row(gchecks([report(0, "node1"), report(1, "node2", clock=1003.0)]),
                "clock skew")
    assert check.status == WARN
    assert check.hint == "synchronise the nodes' clocks (chronyd or ntpd on every node)"


def test_a_node_that_did_not_join_fails() -> None:
    check = row(gchecks([report(0, "node1")], nodes=("node1", "node2")), "group")
    assert check.status == FAIL
    assert "no rank joined from node2" in check.detail


def test_a_rank_that_never_answers_is_named() -> None:
    error = InitTimeoutError([1], world_size=2, timeout=3.0, nodes={1: "node2"}, rank=0)
    check = join_failed(error, 3.0)
    assert check.status == FAIL
    assert "rank 1 (on node2)" in check.detail
    assert check.hint.startswith("start every rank (srun/mpirun task counts")


def test_merge_names_each_failing_rank_and_keeps_the_worst() -> None:
    ok, bad = Check("x", OK, "fine"), Check("x", FAIL, "broken", "do y")
    merged = merge([("rank 0 (a)", [ok]), ("rank 1 (b)", [bad]), ("rank 2 (b)", [bad])])
    assert merged == [Check("x", FAIL, "rank 1 (b), rank 2 (b): FAIL broken", "do y")]


def test_table_and_json() -> None:
    rows = [Check("a", OK, "fine"), Check("b", FAIL, "broken", "export B=1")]
    text = format_table(rows, ["head"])
    assert text.splitlines()[0] == "head"
    assert "HINT: export B=1" in text
    assert text.splitlines()[-1] == "doctor FAILED: 1 OK, 0 WARN, 1 FAIL"
    assert to_json(rows)["ok"] is False


def test_an_unreachable_master_alone_blocks_the_group() -> None:
    """The route exists but the connect times out: the group is not tried."""
    from unirank.cli.doctor import group_blocker

    rows = checks.local_checks(facts(probe="timeout"))
    assert [r.name for r in rows if r.status == FAIL] == ["master reachable"]
    blocker = group_blocker(rows)
    assert blocker is not None and blocker.name == "master reachable"
    assert group_blocker(checks.local_checks(facts())) is None


def test_a_skipped_row_is_counted_apart() -> None:
    rows = [Check("a", FAIL, "broken", "export A=1"), Check("group", SKIP, "skipped")]
    assert format_table(rows).splitlines()[-1] == "doctor FAILED: 0 OK, 0 WARN, 1 FAIL, 1 SKIP"


def test_a_port_picked_for_spawned_ranks_does_not_warn_about_its_range() -> None:
    """``-n`` on one node picks a free port, as unirank run does: it is bound at once."""
    check = row(checks.local_checks(facts(port_picked=True, serves=True, port_free=True,
                                          env=dataclasses.replace(facts().env,
                                                                  master_port=40000))),
                "master port")
    assert (check.status, check.detail.split(" ")[0]) == (OK, "40000")


def test_the_group_row_names_the_port_the_group_met_on() -> None:
    reports = [report(r, "n", port=41234) for r in (0, 1)]
    check = row(group_checks(reports, expected_nodes=(), backend="gloo", seconds=1.0), "group")
    assert "joined a gloo group on port 41234 in 1.0 s" in check.detail


def test_torch_cpp_frames_are_kept_off_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    """What the process and a child write to fd 2 passes, but torch's C++ log lines and frame
    dumps (also as a failure summary quotes them)."""
    import os
    import subprocess
    import sys

    from unirank.doctor.quiet import without_cpp_frames

    noise = ("[W1125 18:46:29.883876765 TCPStore.cpp:340] [c10d] TCP client failed\n"
             "Exception raised from throwTimeoutError at socket.cpp:1030:\n"
             "frame #0: c10::Error::Error() + 0x98 (0x7ff in libc10.so)\n"
             "<omitting python frames>\n\n    | frame #3: <unknown function>\n")
    with without_cpp_frames():
        os.write(2, f"{noise}kept line\n".encode())
        subprocess.run([sys.executable, "-c", f"import sys; sys.stderr.write({noise!r} + "
                        "'child line\\n')"], check=True, timeout=60)
    assert capfd.readouterr().err == "kept line\nchild line\n"
