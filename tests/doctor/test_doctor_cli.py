"""``unirank doctor`` as a user runs it (real processes, real sockets, real name look-ups): healthy
set-ups exit 0; each provoked failure exits 1 with its row and exact hint."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from typing import Any, Optional

import pytest

from _procs import Runner, free_port, launcher_free_environ, unavailable
from unirank import netroute

UNIRANK = [sys.executable, "-m", "unirank", "doctor"]


def doctor(*args: str, env: Optional[Mapping[str, str]] = None,
           timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``unirank doctor ARGS`` without any launcher's variables, plus ``env``."""
    return subprocess.run([*UNIRANK, *args], env=launcher_free_environ(env),
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def checks(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    """The rows of ``--json`` output, by check name."""
    data = json.loads(proc.stdout)
    return {row["name"]: row for row in data["checks"]}


def test_plain_python_is_healthy_and_imports_no_torch() -> None:
    code = ("import sys\nfrom unirank.cli.main import main\nrc = main(['doctor'])\n"
            "print('TORCH', 'torch' in sys.modules)\nsys.exit(rc)")
    env = launcher_free_environ({"MASTER_PORT": str(free_port())})  # 29500 may be busy here
    proc = subprocess.run([sys.executable, "-c", code], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-2].startswith("doctor passed:"), proc.stdout
    assert proc.stdout.splitlines()[-1] == "TORCH False", proc.stdout


def test_json_lists_every_check() -> None:
    proc = doctor("--json", env={"MASTER_PORT": str(free_port())})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = checks(proc)
    assert {"launcher", "gpus", "torch", "master address", "master port",
            "route to master", "reverse lookup"} <= set(rows)
    assert json.loads(proc.stdout)["ok"] is True


def test_bad_interface_name_fails() -> None:
    proc = doctor("--json", env={"GLOO_SOCKET_IFNAME": "nosuch0"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    row = checks(proc)["GLOO_SOCKET_IFNAME"]
    assert row["status"] == "FAIL"
    assert row["hint"] == "export GLOO_SOCKET_IFNAME=lo"  # the interface routing to 127.0.0.1


def test_port_already_bound_fails_naming_this_process() -> None:
    with socket.socket() as sock:
        sock.bind(("", 0))
        sock.listen()
        port = sock.getsockname()[1]
        proc = doctor(env={"MASTER_PORT": str(port)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    row = next(line for line in lines if line.startswith("master port"))
    assert f"FAIL    {port} is already in use on this host, by pid " in row, proc.stdout
    hint = lines[lines.index(row) + 1].strip()
    assert hint == "HINT: export MASTER_PORT=<a free port, the same on every rank>"


def test_unresolvable_master_fails() -> None:
    proc = doctor("--json", env={"MASTER_ADDR": "no.such.host.invalid"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    row = checks(proc)["master address"]
    assert row["status"] == "FAIL"
    assert row["hint"] == ("export MASTER_ADDR=<a host name or address every node resolves, "
                           "e.g. the first node's>")


def test_an_ipv6_master_resolves_and_routes_through_lo() -> None:
    if "::1" not in netroute.interfaces().get("lo", ()):
        pytest.skip("this host has no IPv6 loopback")
    proc = doctor("--json", env={"MASTER_ADDR": "::1", "MASTER_PORT": str(free_port())})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = checks(proc)
    assert rows["master address"]["detail"].startswith("::1 -> ::1 ("), rows
    assert rows["route to master"]["detail"] == "lo (::1) routes to ::1", rows
    assert rows["reverse lookup"]["detail"].startswith("::1: "), rows
    assert "::ffff:" not in rows["reverse lookup"]["detail"], rows


def test_nccl_without_gpus_fails() -> None:
    proc = doctor("--json", "--backend", "nccl",
                  env={"CUDA_VISIBLE_DEVICES": "", "MASTER_PORT": str(free_port())})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert checks(proc)["gpus"]["status"] == "FAIL"


def test_two_spawned_ranks_are_healthy() -> None:
    port = free_port()
    proc = doctor("-n", "2", "--json", env={"MASTER_PORT": str(port)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = checks(proc)
    assert rows["group"]["status"] == "OK"
    assert rows["group"]["detail"].startswith("2 ranks on 1 node (")
    assert f") joined a gloo group on port {port} in " in rows["group"]["detail"]
    assert rows["master port"]["detail"].split(" ")[0] == str(port)
    assert rows["same versions"]["status"] == "OK"
    header = json.loads(proc.stdout)["header"]
    assert header[0].startswith("unirank doctor: 2 spawned ranks, ranks 0-1 of 2, on "), header
    assert header[0].endswith("; group check: gloo group of 2, timeout 15 s"), header


#: TEST-NET-2 (RFC 5737): on no interface of this host
FOREIGN = "198.51.100.7"


def test_spawned_ranks_check_the_master_and_port_they_use() -> None:
    """``-n`` on one node: the rows check 127.0.0.1 and the free port the group then meets on,
    not a stale MASTER_ADDR nor 29500."""
    proc = doctor("-n", "2", "--json", env={"MASTER_ADDR": FOREIGN})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = checks(proc)
    assert rows["master address"]["detail"].startswith("127.0.0.1 -> 127.0.0.1 "), rows
    port = rows["master port"]["detail"].split(" ")[0]
    assert port != "29500" and rows["master port"]["status"] == "OK", rows
    assert f"joined a gloo group on port {port} in " in rows["group"]["detail"], rows
    assert FOREIGN not in proc.stdout + proc.stderr


def test_under_unirank_run_two_ranks_are_healthy(runner: Runner) -> None:
    """``unirank run -n 2 -m unirank doctor``: each worker is a rank of the run's world."""
    proc = runner.run(["-n", "2", "-m", "unirank", "doctor", "--json"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = checks(proc)
    assert [name for name, row in rows.items() if row["status"] != "OK"] == [], proc.stdout
    assert rows["group"]["detail"].startswith("2 ranks on 1 node "), proc.stdout


def test_a_rank_that_never_answers_is_named() -> None:
    """Rank 0 of a torchrun-style world of 2 whose rank 1 is never started."""
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    proc = doctor("--json", "--timeout", "3", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    row = checks(proc)["group"]
    assert row["status"] == "FAIL"
    assert "1 of 2 ranks did not join within 3 s: rank 1" in row["detail"], row
    assert row["hint"].startswith("start every rank (srun/mpirun task counts")


def test_a_blocking_failure_skips_the_group() -> None:
    """With a gloo interface that does not exist no group can form: ``-n 2`` does not spawn,
    and the group row says why."""
    proc = doctor("-n", "2", "--json", env={"GLOO_SOCKET_IFNAME": "nosuch0"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = checks(proc)
    assert rows["group"]["status"] == "SKIP"
    assert rows["group"]["detail"] == ("skipped: the 'GLOO_SOCKET_IFNAME' row failed, and no "
                                       "group can form until it is fixed")
    assert "Traceback" not in proc.stderr, proc.stderr


#: an address with a route but no owner inside a private network namespace (see
#: :func:`in_private_network`): a connect to it gets no answer, and no packet leaves
UNANSWERED = "10.255.255.1"


def in_private_network(command: list[str]) -> list[str]:
    """``command`` run by ``unshare`` in a network namespace of its own (a user namespace too,
    so that no root is needed where the kernel allows it) whose loopback also routes
    10.255.255.0/24: nothing sent to :data:`UNANSWERED` leaves the namespace."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run(
            [unshare, "-rn", "true"], capture_output=True, timeout=30).returncode != 0:
        unavailable("unshare -rn (a private network namespace) is not available here")
    setup = "ip link set lo up && ip route add 10.255.255.0/24 dev lo src 127.0.0.1 && exec \"$@\""
    return [unshare, "-rn", "sh", "-c", setup, "sh", *command]


def test_an_unreachable_master_skips_the_group() -> None:
    """Rank 1 of a torchrun-style world whose master no packet reaches: the group is not
    tried (it would wait out the timeout, printing torch's C++ frames); the row names the
    master row that failed."""
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": UNANSWERED, "MASTER_PORT": str(free_port())}
    proc = subprocess.run(in_private_network([*UNIRANK, "--json", "--timeout", "120"]),
                          env=launcher_free_environ(env), capture_output=True, text=True,
                          timeout=100, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = checks(proc)
    assert rows["master reachable"]["status"] == "FAIL", rows
    assert rows["group"]["status"] == "SKIP", rows
    assert rows["group"]["detail"].startswith("skipped: the 'master reachable' row failed")
    assert proc.stderr == ""
