"""MPI launchers: Open MPI, MPICH/Hydra, Intel MPI, Cray PALS, MVAPICH, PMIx, jsrun."""

from __future__ import annotations

import pytest

from unirank.errors import ConfigError
from unirank.launchers import detect
from unirank.rendezvous import derive_port

OMPI_RANK1_OF_2 = {
    # `mpirun --allow-run-as-root --oversubscribe -np 2` on one node (Open MPI 4.1)
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
    "OMPI_MCA_ess_base_jobid": "2815688705",
    "PMIX_RANK": "1",
    "PMIX_NAMESPACE": "2815688705",
}


def test_openmpi_single_node() -> None:
    env = detect(OMPI_RANK1_OF_2, argv=[], hostname="vm")
    assert env.launcher == "openmpi"
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (1, 1, 2, 2)
    assert (env.node_rank, env.num_nodes) == (0, 1)  # NOT OMPI_COMM_WORLD_NODE_RANK
    assert env.master_addr == "127.0.0.1"
    assert env.job_id == "2815688705"
    # Open MPI's job id and no step id (the id comes from OMPI_MCA_ess_base_jobid, not Slurm):
    # 20000 + 12 * (2815688705 mod 1000) + 0
    assert env.master_port == derive_port("2815688705", None) == 28460


def test_openmpi_multi_node_needs_master_addr() -> None:
    environ = {**OMPI_RANK1_OF_2, "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3"}
    env = detect(environ, argv=[])
    assert (env.num_nodes, env.node_rank) == (2, 1)
    assert env.master_addr is None
    with pytest.raises(ConfigError, match="^MASTER_ADDR=<unset>.*HINT: export MASTER_ADDR"):
        env.require_master()


def test_openmpi_with_master_as_supercloud_gives_it() -> None:
    environ = {**OMPI_RANK1_OF_2, "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3",
               "MASTER_ADDR": "d-3-1", "MASTER_PORT": "29501"}
    assert detect(environ, argv=[]).require_master() == ("d-3-1", 29501)


def test_mpirun_inside_slurm_uses_mpi_ranks_and_slurm_hosts() -> None:
    """Open MPI starts its daemons with srun: the ranks see the daemons' step (1 task/node)."""
    environ = {
        **OMPI_RANK1_OF_2,
        "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3",
        "SLURM_JOB_ID": "60", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_JOB_NODELIST": "node[1-2]", "SLURMD_NODENAME": "node2",
    }
    env = detect(environ, argv=[])
    assert env.launcher == "openmpi"
    assert (env.rank, env.world_size, env.node_rank) == (3, 4, 1)
    assert env.master_addr == "node1"
    assert env.node_name == "node2"


def test_srun_mpi_pmix_is_reported_as_slurm() -> None:
    """srun --mpi=pmix sets PMIX_RANK and the step agrees: Slurm knows more (the nodes)."""
    environ = {
        "PMIX_RANK": "1", "PMIX_NAMESPACE": "slurm.pmix.61.0", "SLURM_JOB_ID": "61",
        "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
        "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NODELIST": "node1",
        "SLURM_STEP_TASKS_PER_NODE": "2", "SLURMD_NODENAME": "node1", "PMI_SIZE": "2",
    }
    assert detect(environ, argv=[]).launcher == "slurm"


HYDRA_RANK5 = {
    # MPICH's Hydra `mpiexec -n 8 -ppn 4` (two nodes)
    "PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4",
    "PMI_FD": "7", "PMI_JOBID": "kvs_1234_0",
}


def test_mpich_hydra() -> None:
    env = detect(HYDRA_RANK5, argv=[])
    assert env.launcher == "mpich"
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (5, 1, 8, 4)
    assert (env.node_rank, env.num_nodes) == (1, 2)
    assert env.job_id == "kvs_1234_0"


def test_intel_mpi_is_named() -> None:
    env = detect({**HYDRA_RANK5, "I_MPI_HYDRA_TOPOLIB": "hwloc", "I_MPI_ROOT": "/opt/intel"},
                 argv=[])
    assert env.launcher == "intelmpi"


def test_cray_pals_local_variables() -> None:
    environ = {"PMI_RANK": "3", "PMI_SIZE": "4", "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "2",
               "PALS_APID": "abc-123", "MASTER_ADDR": "x1000c0s0b0n0"}
    env = detect(environ, argv=[])
    assert (env.launcher, env.local_rank, env.local_world_size, env.node_rank) == (
        "mpich", 1, 2, 1)
    assert env.master_addr == "x1000c0s0b0n0"


def test_mvapich() -> None:
    environ = {"MV2_COMM_WORLD_RANK": "2", "MV2_COMM_WORLD_SIZE": "4",
               "MV2_COMM_WORLD_LOCAL_RANK": "0", "MV2_COMM_WORLD_LOCAL_SIZE": "2"}
    env = detect(environ, argv=[])
    assert (env.launcher, env.rank, env.node_rank, env.num_nodes) == ("mvapich", 2, 1, 2)


def test_pmix_alone_needs_a_size() -> None:
    with pytest.raises(ConfigError, match="^PMIX_RANK='0'.*HINT: export WORLD_SIZE"):
        detect({"PMIX_RANK": "0", "PMIX_NAMESPACE": "prterun-vm-1@1"}, argv=[])


def test_pmix_with_world_size() -> None:
    env = detect({"PMIX_RANK": "1", "PMIX_NAMESPACE": "ns", "PMI_SIZE": "2"}, argv=[])
    assert (env.launcher, env.rank, env.world_size, env.job_id) == ("pmix", 1, 2, "ns")


JSRUN = {
    # Summit: `jsrun -n4 -a1 -g1` over two compute hosts; the batch node comes first
    "LSB_JOBID": "987654",
    "LSB_MCPU_HOSTS": "batch3 1 a01n01 42 a01n02 42",
    "JSM_NAMESPACE_RANK": "2", "JSM_NAMESPACE_SIZE": "4", "JSM_NAMESPACE_LOCAL_RANK": "0",
    "JSM_NAMESPACE_LOCAL_SIZE": "2",
}


def test_jsrun_lsf_skips_launch_node() -> None:
    """From IBM's jsrun/LSF documentation (no LSF cluster here): variables, not a live job."""
    env = detect(JSRUN, argv=[])
    assert env.launcher == "lsf"
    assert env.hosts == ("a01n01", "a01n02")
    assert env.master_addr == "a01n01"
    assert (env.rank, env.node_rank, env.num_nodes, env.job_id) == (2, 1, 2, "987654")


def test_jsrun_rank_file() -> None:
    files = {"/tmp/rankfile": "batch3\na01n01\na01n01\na01n02\na01n02\n"}
    environ = {k: v for k, v in JSRUN.items() if k != "LSB_MCPU_HOSTS"}
    env = detect({**environ, "LSB_DJOB_RANKFILE": "/tmp/rankfile"}, argv=[],
                 read_text=files.__getitem__)
    assert env.hosts == ("a01n01", "a01n02")


def test_jsrun_missing_rank_file_is_an_error() -> None:
    def missing(path: str) -> str:
        raise FileNotFoundError(2, "No such file or directory", path)

    with pytest.raises(ConfigError, match="^LSB_DJOB_RANKFILE='/nope'"):
        detect({**JSRUN, "LSB_DJOB_RANKFILE": "/nope"}, argv=[], read_text=missing)


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({**OMPI_RANK1_OF_2, "OMPI_COMM_WORLD_RANK": "2"}, "OMPI_COMM_WORLD_RANK"),
        ({**OMPI_RANK1_OF_2, "OMPI_COMM_WORLD_SIZE": ""}, "OMPI_COMM_WORLD_SIZE"),
        ({**OMPI_RANK1_OF_2, "OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, "OMPI_COMM_WORLD_LOCAL_SIZE"),
        ({**HYDRA_RANK5, "MPI_LOCALRANKID": "4"}, "MPI_LOCALRANKID"),
        ({"PMI_RANK": "0"}, "PMI_SIZE"),
        ({**JSRUN, "LSB_MCPU_HOSTS": "a 1 b"}, "LSB_MCPU_HOSTS"),
    ],
)
def test_mpi_errors_name_the_variable(environ: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as info:
        detect(environ, argv=[])
    assert str(info.value).startswith(variable), str(info.value)
