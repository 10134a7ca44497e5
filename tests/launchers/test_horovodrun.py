"""detect() for horovodrun's workers, from dicts (the recorded ones are in test_recorded.py)."""

from __future__ import annotations

import pytest

from unirank.errors import ConfigError
from unirank.launchers import detect

BASE = {
    "HOROVOD_RANK": "5", "HOROVOD_SIZE": "8", "HOROVOD_LOCAL_RANK": "1",
    "HOROVOD_LOCAL_SIZE": "4", "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2",
    "HOROVOD_HOSTNAME": "host2", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1",
    "HOROVOD_GLOO_RENDEZVOUS_PORT": "41234", "HOROVOD_CONTROLLER": "gloo",
}


def test_two_hosts_of_four_slots() -> None:
    env = detect(BASE, [], hostname="ignored")
    assert (env.launcher, env.rank, env.world_size, env.local_rank, env.local_world_size,
            env.node_rank, env.num_nodes) == ("horovodrun", 5, 8, 1, 4, 1, 2)
    assert (env.node_name, env.master_addr) == ("host2", "10.0.0.1")
    # the port comes from unirank's job formula applied to the rendezvous port: 41234 mod 1000
    assert env.master_port == 20000 + 12 * 234
    assert env.sources["master_addr"] == "first host of HOROVOD_GLOO_RENDEZVOUS_ADDR"


def test_explicit_master_and_slurm_node_name_win() -> None:
    env = detect({**BASE, "MASTER_ADDR": "m", "MASTER_PORT": "29999",
                  "SLURMD_NODENAME": "nid007"}, [])
    assert (env.master_addr, env.master_port, env.node_name) == ("m", 29999, "nid007")


def test_horovodrun_outranks_the_slurm_job_around_it() -> None:
    environ = {**BASE, "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0",
               "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NODELIST": "n[1-2]",
               "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_STEP_NUM_TASKS": "1",
               "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NODELIST": "n1"}
    assert detect(environ, []).launcher == "horovodrun"


def test_without_cross_variables_nodes_are_derived_by_slot() -> None:
    environ = {k: v for k, v in BASE.items() if "CROSS" not in k}
    env = detect(environ, [])
    assert (env.node_rank, env.num_nodes) == (1, 2)


@pytest.mark.parametrize(
    ("change", "variable"),
    [
        ({"HOROVOD_LOCAL_SIZE": None}, "HOROVOD_RANK"),
        ({"HOROVOD_RANK": "8"}, "HOROVOD_RANK"),
        ({"HOROVOD_SIZE": "zero"}, "HOROVOD_SIZE"),
        ({"HOROVOD_LOCAL_RANK": "4"}, "HOROVOD_LOCAL_RANK"),
        ({"HOROVOD_CROSS_RANK": "2"}, "HOROVOD_CROSS_RANK"),
    ],
)
def test_bad_values_name_the_variable(change: dict[str, str | None], variable: str) -> None:
    environ = dict(BASE)
    for key, value in change.items():
        if value is None:
            environ.pop(key)
        else:
            environ[key] = value
    with pytest.raises(ConfigError) as caught:
        detect(environ, [])
    assert caught.value.variable == variable
    assert "HINT" in str(caught.value)
