"""PBS/Torque, Kubeflow, local, forcing a launcher, precedence, and the never-raise property."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unirank.errors import ConfigError
from unirank.launchers import PRECEDENCE, detect, explain

NODEFILE = "cn01\ncn01\ncn02\ncn02\n"
PBS_TASK = {"PBS_JOBID": "1234.pbs01", "PBS_NODEFILE": "/var/spool/pbs/aux/1234.pbs01",
            "PBS_VNODENUM": "3", "PBS_TASKNUM": "4"}


def test_pbsdsh_task() -> None:
    """Variables as PBS/Torque document them for pbsdsh (no PBS server here)."""
    env = detect(PBS_TASK, argv=[], read_text={PBS_TASK["PBS_NODEFILE"]: NODEFILE}.__getitem__)
    assert env.launcher == "pbs"
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 4, 1, 2)
    assert (env.node_rank, env.num_nodes, env.node_name) == (1, 2, "cn02")
    assert env.master_addr == "cn01"


def test_pbs_batch_shell_is_not_a_task() -> None:
    env = detect({"PBS_JOBID": "1", "PBS_NODEFILE": "/x"}, argv=[], hostname="cn01")
    assert env.launcher == "local"


def test_pbs_vnodenum_beyond_nodefile() -> None:
    with pytest.raises(ConfigError, match="^PBS_VNODENUM='9'"):
        detect({**PBS_TASK, "PBS_VNODENUM": "9"}, argv=[],
               read_text={PBS_TASK["PBS_NODEFILE"]: NODEFILE}.__getitem__)


def test_mpirun_in_pbs_takes_master_from_nodefile() -> None:
    environ = {"PBS_JOBID": "7.pbs", "PBS_NODEFILE": "/nf", "OMPI_COMM_WORLD_RANK": "0",
               "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
               "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    env = detect(environ, argv=[], read_text={"/nf": NODEFILE}.__getitem__)
    assert (env.launcher, env.master_addr, env.hosts) == ("openmpi", "cn01", ("cn01", "cn02"))


KUBEFLOW = {"MASTER_ADDR": "pytorch-job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3",
            "RANK": "2", "HOSTNAME": "pytorch-job-worker-1"}


def test_kubeflow_pytorchjob() -> None:
    """Variables as Kubeflow's training operator documents them (no Kubernetes here). The node
    is named by the common rule (the pod's host name), not by an inherited HOSTNAME variable."""
    env = detect({**KUBEFLOW, "HOSTNAME": "stale-shell-name"}, argv=[],
                 hostname="pytorch-job-worker-1")
    assert env.launcher == "kubeflow"
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (2, 3, 0, 1)
    assert (env.node_rank, env.num_nodes) == (2, 3)
    assert (env.master_addr, env.master_port) == ("pytorch-job-master-0", 23456)
    assert env.node_name == "pytorch-job-worker-1"


def test_local_default() -> None:
    env = detect({}, argv=[], hostname="laptop")
    assert (env.launcher, env.rank, env.world_size, env.node_name) == ("local", 0, 1, "laptop")
    assert (env.master_addr, env.master_port) == ("127.0.0.1", 29500)


def test_force_none_turns_detection_off() -> None:
    env = detect({**KUBEFLOW, "UNIRANK_LAUNCHER": "none"}, argv=[])
    assert (env.launcher, env.world_size) == ("local", 1)


def test_force_a_launcher_over_precedence() -> None:
    environ = {**KUBEFLOW, "SLURM_JOB_ID": "5", "SLURM_NTASKS": "2", "UNIRANK_LAUNCHER": "kubeflow"}
    assert detect(environ, argv=[]).launcher == "kubeflow"


def test_force_unknown_or_absent_launcher() -> None:
    with pytest.raises(ConfigError, match="^UNIRANK_LAUNCHER='lsfx'.*HINT: use one of"):
        detect({"UNIRANK_LAUNCHER": "lsfx"}, argv=[])
    with pytest.raises(ConfigError, match="^UNIRANK_LAUNCHER='slurm'.*not set"):
        detect({"UNIRANK_LAUNCHER": "slurm"}, argv=[])


def test_explain_names_chosen_outranked_and_absent() -> None:
    environ = {**KUBEFLOW, "SLURM_JOB_ID": "5", "SLURM_NTASKS": "2"}
    by_name = {c.name: c for c in explain(environ, argv=[])}
    assert by_name["kubeflow"].status == "chosen"
    assert by_name["slurm-allocation"].status == "outranked"
    assert by_name["openmpi"].status == "absent"
    assert "OMPI_COMM_WORLD_RANK" in by_name["openmpi"].reason
    assert [c.name for c in explain({}, argv=[])] == [entry.name for entry in PRECEDENCE]


_NAMES = st.sampled_from(
    ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
     "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID",
     "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS",
     "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_STEP_NUM_NODES", "SLURM_NNODES",
     "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURMD_NODENAME",
     "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
     "PMIX_RANK", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "JSM_NAMESPACE_RANK",
     "JSM_NAMESPACE_SIZE", "LSB_JOBID", "LSB_MCPU_HOSTS", "LSB_DJOB_RANKFILE", "PBS_JOBID",
     "PBS_VNODENUM", "PBS_NODEFILE", "UNIRANK_LAUNCHER"]
)
_VALUES = st.one_of(
    st.integers(-3, 12).map(str),
    st.sampled_from(["", "node[1-2]", "n[1-3", "2(x2)", "1,1", "none", "x", "a 1 b 2", "slurm"]),
    st.text(max_size=12),
)


@settings(max_examples=600, deadline=None)
@given(st.dictionaries(_NAMES, _VALUES, max_size=14), st.lists(st.text(max_size=12), max_size=3))
def test_detect_returns_distenv_or_raises_config_error(environ: dict[str, str],
                                                       argv: list[str]) -> None:
    def read_text(path: str) -> str:
        if path.startswith("/"):
            raise FileNotFoundError(2, "No such file", path)
        return path

    try:
        env = detect(environ, argv=argv, read_text=read_text, hostname="h")
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    assert 0 <= env.rank < env.world_size
    assert 0 <= env.local_rank < env.local_world_size
    assert 0 <= env.node_rank < env.num_nodes
