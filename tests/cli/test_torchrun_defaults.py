"""torchrun's defaults with real processes, each checked by hand against torchrun 2.13: two
"pods" given only Kubeflow Trainer v2's ``PET_*`` variables run the bare ``unirank run x.py``
and form one world of 4 on loopback, and the command line wins over them; the run id and
MASTER_ADDR of one node (an exported MASTER_ADDR changes nothing there); SIGHUP forwarded;
``--rdzv-endpoint localhost:0``; ``--logs-specs`` refused with exit 1.

Environment variables read: the caller's environment, from which launcher variables (PET_*
too) are removed (:func:`_procs.launcher_free_environ`).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from _procs import SIGNAL_WAIT, Runner, free_port

pytestmark = pytest.mark.integration

ALL_REDUCE = """
import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print("W", os.environ["RANK"], os.environ["WORLD_SIZE"], int(t.item()), flush=True)
dist.destroy_process_group()
"""


def test_two_pods_with_only_kubeflow_s_pet_variables_form_one_world(runner: Runner,
                                                                     tmp_path: Path) -> None:
    runner.script("x.py", ALL_REDUCE)
    port = str(free_port())
    pods = [runner.start(["x.py"], text=True, env={
        "PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": str(rank),
        "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": port}) for rank in (0, 1)]
    seen = []
    for rank, pod in enumerate(pods):
        try:
            out, err = pod.communicate(timeout=runner.timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"pod {rank} did not end in {runner.timeout:g} s")
        assert pod.returncode == 0, err
        assert f"--node-rank {rank} (PET_NODE_RANK)" in err.splitlines()[0]
        seen += re.findall(r"^W (\d) (\d) (\d)$", out, re.M)
    assert sorted(seen) == [(str(r), "4", "4") for r in range(4)]


def test_the_command_line_wins_over_pet_nproc_per_node(runner: Runner) -> None:
    runner.script("x.py", "import os\nprint('RANK', os.environ['RANK'], flush=True)\n")
    result = runner.run(["--nproc-per-node", "1", "x.py"], env={"PET_NPROC_PER_NODE": "3"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["RANK", "0"]


ENV = """
import json, os
keys = ("RANK", "MASTER_ADDR", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_SIGNALS_TO_HANDLE")
print("ENV", json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
"""


def _envs(stdout: str) -> list[dict[str, str]]:
    return [json.loads(line[4:]) for line in stdout.splitlines() if line.startswith("ENV ")]


def test_one_node_gets_torchrun_s_run_id_master_addr_and_signals(runner: Runner) -> None:
    runner.script("env.py", ENV)
    result = runner.run(["-n", "2", "env.py"])
    assert result.returncode == 0, result.stderr
    envs = _envs(result.stdout)
    assert {e["MASTER_ADDR"] for e in envs} == {"localhost"}
    (run_id,) = {e["TORCHELASTIC_RUN_ID"] for e in envs}
    assert str(uuid.UUID(run_id)) == run_id
    assert {e["TORCHELASTIC_SIGNALS_TO_HANDLE"] for e in envs} == {
        "SIGTERM,SIGINT,SIGHUP,SIGQUIT"}
    standalone = runner.run(["--standalone", "-n", "1", "env.py"])
    assert [e["MASTER_ADDR"] for e in _envs(standalone.stdout)] == ["localhost"]
    static = runner.run(["-n", "2", "--master-port", str(free_port()), "env.py"])
    assert {(e["MASTER_ADDR"], e["TORCHELASTIC_RUN_ID"]) for e in _envs(static.stdout)} == {
        ("127.0.0.1", "none")}


def test_an_exported_master_addr_does_not_change_one_node_s_master(runner: Runner) -> None:
    """torchrun 2.13, ``torchrun --nproc-per-node 2 env.py`` with MASTER_ADDR=127.0.0.1 or
    MASTER_ADDR=myhost.example exported, checked by hand: its workers see
    MASTER_ADDR=localhost all the same (its one-node rendezvous is at localhost:0; it reads no
    MASTER_ADDR). So do unirank run's, from one pass of the planner."""
    runner.script("env.py", ENV)
    for exported in ("127.0.0.1", "myhost.example"):
        result = runner.run(["-n", "2", "env.py"], env={"MASTER_ADDR": exported})
        assert result.returncode == 0, result.stderr
        assert [e["MASTER_ADDR"] for e in _envs(result.stdout)] == ["localhost"] * 2, exported


def test_rdzv_endpoint_localhost_0_takes_a_free_port(runner: Runner) -> None:
    runner.script("x.py", ALL_REDUCE)
    result = runner.run(["-n", "2", "--rdzv-endpoint", "localhost:0", "x.py"])
    assert result.returncode == 0, result.stderr
    assert sorted(re.findall(r"^W (\d) 2 2$", result.stdout, re.M)) == ["0", "1"]


def test_an_unknown_logs_specs_ends_with_torchrun_s_exit_1(runner: Runner) -> None:
    runner.script("x.py", "print('ran')\n")
    result = runner.run(["--logs-specs=DOESNOT_EXIST", "x.py"])
    assert result.returncode == 1
    assert result.stdout == ""
    assert "--logs-specs='DOESNOT_EXIST': is no installed" in result.stderr


HUP = SIGNAL_WAIT + """
import signal
on_signals(signal.SIGHUP)
print("ready", flush=True)
while next_signal() != signal.SIGHUP:
    pass
print("got SIGHUP", flush=True)
"""


def test_sighup_is_forwarded_to_the_workers_and_stops_the_run(runner: Runner) -> None:
    """As torchrun, SIGHUP reaches the workers and stops the run (a closed terminal): the run
    ends by it, 128 + SIGHUP as for SIGTERM, although the rank ended 0."""
    runner.script("hup.py", HUP)
    proc = runner.start(["-n", "1", "hup.py"], text=False)
    assert proc.stdout is not None
    runner.read_lines(proc.stdout, 1, contains="ready")
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=runner.timeout)
    assert proc.returncode == 128 + signal.SIGHUP, err
    assert b"got SIGHUP" in out
