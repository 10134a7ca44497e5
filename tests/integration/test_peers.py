"""Peers as consumers: pytorch-ignite, HF Accelerate and Lightning Fabric programs that know nothing
of unirank run unchanged under ``unirank run``, locally and inside srun on the two-node testbed.

The programs are ``tests/integration/scripts/peer_{ignite,accelerate,fabric}.py``; each rank prints
one ``TAG {json}`` line with what the library itself reports (rank, world size, local rank, node
rank, ...) and the result of a collective (ignite's ``all_reduce``, Accelerate's ``gather``,
Fabric's ``all_reduce``/``all_gather``). Accelerate and Fabric also take one DDP step on different
data per rank: equal parameter checksums on every rank mean the gradients were averaged.

Layouts asserted (what the libraries do there was observed, see the README section):

* ``unirank run -n 2 prog.py``: all three see world 2 on one node.
* ``srun -N2 --ntasks-per-node=2 python -m unirank run prog.py`` (each srun task one rank): all
  three see world 4, two nodes, local ranks 0/1 on each node.
* ``srun -N2 --ntasks-per-node=1 python -m unirank run -n 2 prog.py`` (one launcher per node):
  Accelerate and Fabric see world 4. ignite refuses this layout itself: on several nodes its
  Slurm check wants ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` equal to ``SLURM_PROCID``,
  ``SLURM_LOCALID`` and ``SLURM_NTASKS`` (torchrun inside srun is refused the same way), so that
  refusal, which is ignite's, is not asserted here.

A missing peer library skips with a one-line reason; with ``CI=true`` it fails (DEVELOPERS.md).

Environment variables read: ``CI``, and the caller's environment, from which launcher variables
(and ``ACCELERATE_*``, ``PYTHONUNBUFFERED``, ``OMP_NUM_THREADS``) are removed for the local runs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pytest

from _procs import Runner, unavailable

if TYPE_CHECKING:
    from conftest import SlurmTestbed

pytestmark = pytest.mark.integration

TIMEOUT = 180.0  # safety net only: a run takes seconds
SCRIPTS = Path(__file__).resolve().parent / "scripts"
#: ranks that joined give up after this long, naming the missing ones (never a hang)
JOB_ENV = {"UNIRANK_INIT_TIMEOUT": "60"}


def _run_local(runner: Runner, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """``python -m unirank run ARGS`` here, in its own session (killed, workers too, on
    timeout), without any launcher's, torchrun's or Accelerate's variables, with
    :data:`JOB_ENV`."""
    return runner.run(args, env=JOB_ENV, drop=("OMP_NUM_THREADS", "PYTHONUNBUFFERED"),
                      drop_prefixes=("ACCELERATE_",), timeout=TIMEOUT, new_session=True)


def _records(text: str, tag: str) -> dict[int, dict[str, Any]]:
    """The ``TAG {json}`` records in ``text`` by rank. Ranks of one srun step share its stdout
    and a line may be glued to the next, so records are matched anywhere (they hold no nested
    objects); each rank must print exactly one."""
    found: dict[int, dict[str, Any]] = {}
    for match in re.finditer(rf"{tag} (\{{[^{{}}]*\}})", text):
        record = json.loads(match[1])
        rank = int(record["rank"] if "rank" in record else record["process_index"])
        assert rank not in found, f"rank {rank} printed twice:\n{text}"
        found[rank] = record
    return found


# --- the three programs and what each must report -----------------------------------------------

def _check_ignite(rec: dict[str, Any], rank: int, world: int, per_node: int) -> None:
    assert rec["world"] == world
    assert rec["local_rank"] == rec["fn_local_rank"] == rank % per_node
    assert rec["nnodes"] == world // per_node
    assert rec["node_rank"] == rank // per_node
    assert rec["nproc_per_node"] == per_node
    assert rec["backend"] == "gloo"
    assert rec["all_reduce"] == float(world)


def _check_accelerate(rec: dict[str, Any], rank: int, world: int, per_node: int) -> None:
    assert rec["num_processes"] == world
    assert rec["local_process_index"] == rank % per_node
    assert rec["distributed_type"] == "DistributedType.MULTI_CPU"
    assert rec["gathered"] == list(range(world))
    assert len(set(rec["checksums"])) == 1 and len(rec["checksums"]) == world  # DDP synced
    assert rec["batches"] == 16 // (2 * world)  # the DataLoader was sharded over the world


def _check_fabric(rec: dict[str, Any], rank: int, world: int, per_node: int) -> None:
    assert rec["world"] == world
    assert rec["local_rank"] == rank % per_node
    assert rec["node_rank"] == rank // per_node
    assert rec["cluster_environment"] == "TorchElasticEnvironment"  # unirank run's variables
    assert rec["all_reduce"] == float(world)
    assert rec["gathered"] == list(range(world))
    assert len(set(rec["checksums"])) == 1 and len(rec["checksums"]) == world  # DDP synced


@dataclasses.dataclass(frozen=True)
class Peer:
    """One peer library's program: how to run it and what each rank must report."""

    name: str
    module: str  # import name, to tell whether it is installed
    package: str  # pip name
    tag: str
    check: Callable[[dict[str, Any], int, int, int], None]

    @property
    def script(self) -> str:
        return str(SCRIPTS / f"peer_{self.name}.py")

    def args(self, per_node: int, nodes: int) -> list[str]:
        """The program's own arguments for that layout (Fabric takes devices and num_nodes)."""
        return [str(per_node), str(nodes)] if self.name == "fabric" else []

    def require(self) -> None:
        """Skip (fail with ``CI=true``) with a one-line reason when the library is missing."""
        if importlib.util.find_spec(self.module) is None:
            unavailable(f"{self.package} is not installed (it is in the test extra: "
                        f"pip install -e '.[test]')")

    def check_world(self, text: str, world: int, per_node: int, slurm: bool) -> None:
        """Exactly one record per rank ``0..world-1``, each as :attr:`check` wants; in Slurm,
        rank ``r`` ran on ``node{r // per_node + 1}``."""
        records = _records(text, self.tag)
        assert sorted(records) == list(range(world)), f"ranks {sorted(records)}:\n{text}"
        for rank, rec in records.items():
            try:
                self.check(rec, rank, world, per_node)
                if slurm:
                    assert rec["node"] == f"node{rank // per_node + 1}"
            except AssertionError as exc:
                raise AssertionError(f"{self.name} rank {rank}: {rec}\n{text}") from exc


IGNITE = Peer("ignite", "ignite", "pytorch-ignite", "IGNITE", _check_ignite)
ACCELERATE = Peer("accelerate", "accelerate", "accelerate", "ACCELERATE", _check_accelerate)
FABRIC = Peer("fabric", "lightning_fabric", "lightning-fabric", "FABRIC", _check_fabric)
ALL = [pytest.param(p, id=p.name) for p in (IGNITE, ACCELERATE, FABRIC)]


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (f"{' '.join(result.args)} exited {result.returncode}\n"
                                    f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}")
    return result.stdout


# --- tests --------------------------------------------------------------------------------------

@pytest.mark.parametrize("peer", ALL)
def test_unirank_run_two_local_workers(peer: Peer, runner: Runner) -> None:
    peer.require()
    result = _run_local(runner, ["-n", "2", peer.script, *peer.args(2, 1)])
    peer.check_world(_ok(result), world=2, per_node=2, slurm=False)


@pytest.mark.parametrize("peer", ALL)
def test_srun_each_task_one_rank(peer: Peer, slurm_testbed: SlurmTestbed) -> None:
    """``srun -N2 --ntasks-per-node=2 python -m unirank run prog.py``: the layout every peer
    accepts, ignite included (its RANK/LOCAL_RANK/WORLD_SIZE equal Slurm's task numbers)."""
    peer.require()
    result = slurm_testbed.srun(
        Runner.command([peer.script, *peer.args(2, 2)], prefix=["-N2", "--ntasks-per-node=2"]),
        timeout=TIMEOUT, env=JOB_ENV, check=False,
    )
    peer.check_world(_ok(result), world=4, per_node=2, slurm=True)


@pytest.mark.parametrize("peer", [pytest.param(p, id=p.name) for p in (ACCELERATE, FABRIC)])
def test_srun_one_launcher_per_node(peer: Peer, slurm_testbed: SlurmTestbed) -> None:
    """``srun -N2 --ntasks-per-node=1 python -m unirank run -n 2 prog.py``: Accelerate and Fabric
    take torchrun's variables and see world 4 (ignite refuses this layout: see the docstring)."""
    peer.require()
    result = slurm_testbed.srun(
        Runner.command(["-n", "2", peer.script, *peer.args(2, 2)],
                       prefix=["-N2", "--ntasks-per-node=1"]),
        timeout=TIMEOUT, env=JOB_ENV, check=False,
    )
    peer.check_world(_ok(result), world=4, per_node=2, slurm=True)
