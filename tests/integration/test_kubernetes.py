"""The manifests of examples/kubernetes (shown verbatim by docs/kubernetes.md), and their pods
simulated on loopback with exactly the variables the operators inject (tests/integration/
_pods.py; no Kubernetes cluster can run here): pod names resolve inside a private network
namespace, each pod has its own host name, and the container command is the manifest's.

The Trainer v2 and elastic cases rely on ``unirank run`` reading torchrun's ``PET_*``
variables (cli/runoptions.settle)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from _procs import unavailable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _outputs import EXAMPLES, JOB_ENV, check_world, parse_reduce
from _pods import MANIFESTS, Pod, containers, injected, manifest, pod_specs, run_pods

from unirank.contract import DEFAULT_GRACE_PERIOD

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "kubernetes.md"
TIMEOUT = 120.0


def _need_namespaces() -> None:
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "ip", "hostname")):
        unavailable("simulated pods need root, unshare, ip and hostname")


def _run(pods: list[Pod], tmp_path: Path) -> str:
    """Run the pods with train.py = examples/reduction.py; every pod must end 0."""
    (tmp_path / "train.py").write_text((EXAMPLES / "reduction.py").read_text())
    bindir = str(Path(sys.executable).parent)
    extra = {**JOB_ENV, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    codes, logs = run_pods(pods, tmp_path, timeout=TIMEOUT, extra=extra)
    out = "\n".join(logs)
    assert codes == [0] * len(pods), out
    return out


# --- the manifests, golden ---------------------------------------------------------------------

def test_docs_show_every_manifest_verbatim() -> None:
    text = DOC.read_text()
    for path in sorted(MANIFESTS.glob("*.yaml")):
        marker = f"<!-- file: examples/kubernetes/{path.name} -->\n```yaml\n"
        assert marker in text, f"docs/kubernetes.md does not show {path.name}"
        shown = text.split(marker, 1)[1].split("```", 1)[0]
        assert shown == path.read_text(), f"docs/kubernetes.md shows another {path.name}"


def test_pods_outlive_unirank_grace_period() -> None:
    """Every pod of the manifests gives ``unirank run`` more time than its grace period (a
    pod's stop: SIGTERM, then the kubelet's SIGKILL after ``terminationGracePeriodSeconds``,
    30 s when unset): the workers' SIGKILL and the failure summary come before the kubelet's."""
    for name in ("trainjob.yaml", "pytorchjob.yaml", "pytorchjob-elastic.yaml"):
        specs = [s for d in manifest(name) if d["kind"] != "TrainJob" for s in pod_specs(d)]
        assert specs, name
        for spec in specs:
            given = spec.get("terminationGracePeriodSeconds", 30)
            assert given >= DEFAULT_GRACE_PERIOD + 30, (
                f"{name}: terminationGracePeriodSeconds {given} leaves unirank run's grace "
                f"period ({DEFAULT_GRACE_PERIOD:g} s) less than 30 s of margin")


def test_manifests_run_unirank_with_the_operators_variables() -> None:
    """The commands and what each operator injects, as the pod tests below use them."""
    for name in ("trainjob.yaml", "pytorchjob.yaml", "pytorchjob-elastic.yaml"):
        commands = {tuple(c["command"]) for d in manifest(name) if d["kind"] != "TrainJob"
                    for c in containers(d)}
        assert commands == {("unirank", "run", "train.py")}, name
    v2 = injected(manifest("trainjob.yaml"))
    assert [p.name for p in v2] == ["train-node-0-0", "train-node-0-1"]
    assert dict(v2[1].environ) == {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2",
                                   "PET_NODE_RANK": "1",
                                   "PET_MASTER_ADDR": "train-node-0-0.train",
                                   "PET_MASTER_PORT": "29500"}
    v1 = injected(manifest("pytorchjob.yaml"))
    assert [p.name for p in v1] == ["train-master-0", "train-worker-0"]
    assert dict(v1[1].environ) == {"PYTHONUNBUFFERED": "0", "MASTER_ADDR": "train-master-0",
                                   "MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "1"}
    elastic = injected(manifest("pytorchjob-elastic.yaml"))
    assert [p.name for p in elastic] == ["train-worker-0", "train-worker-1"]
    assert dict(elastic[0].environ) == {"PYTHONUNBUFFERED": "0", "PET_NNODES": "1:2",
                                        "PET_RDZV_BACKEND": "c10d",
                                        "PET_RDZV_ENDPOINT": "train-worker-0:23456",
                                        "PET_MAX_RESTARTS": "3", "PET_NPROC_PER_NODE": "2"}


# --- PyTorchJob v1: MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK, detected as `kubeflow` ---------

@pytest.mark.integration
def test_pytorchjob_bare_python_forms_a_world_of_two(tmp_path: Path) -> None:
    _need_namespaces()
    pods = [Pod(p.name, p.environ, ["python", "train.py"])
            for p in injected(manifest("pytorchjob.yaml"))]
    out = _run(pods, tmp_path)
    check_world(parse_reduce(out), 2, addr="train-master-0", port=23456,
                nodes=["train-master-0", "train-worker-0"], reduced=True, context=out)


@pytest.mark.integration
def test_pytorchjob_manifest_command_starts_workers_per_pod(tmp_path: Path) -> None:
    """The manifest's ``unirank run train.py``, verbatim, and with ``-n 2``: one launcher per
    pod, a world of pods x workers (CPU pods: ``auto`` is one worker)."""
    _need_namespaces()
    pods = injected(manifest("pytorchjob.yaml"))
    out = _run(pods, tmp_path)
    check_world(parse_reduce(out), 2, addr="train-master-0", port=23456,
                nodes=["train-master-0", "train-worker-0"], reduced=True, context=out)
    two = [Pod(p.name, p.environ, ["unirank", "run", "-n", "2", "train.py"]) for p in pods]
    out = _run(two, tmp_path)
    check_world(parse_reduce(out), 4, addr="train-master-0", port=23456,
                nodes=["train-master-0"] * 2 + ["train-worker-0"] * 2, reduced=True,
                context=out)


# --- PET_* (Trainer v2, elastic PyTorchJob) ----------------------------------------------------

@pytest.mark.integration
def test_trainjob_pods_form_a_world_of_four(tmp_path: Path) -> None:
    """Trainer v2's exact variables and the bare command ``unirank run train.py``."""
    _need_namespaces()
    out = _run(injected(manifest("trainjob.yaml")), tmp_path)
    check_world(parse_reduce(out), 4, addr="train-node-0-0.train", port=29500,
                nodes=["train-node-0-0"] * 2 + ["train-node-0-1"] * 2, reduced=True,
                context=out)


@pytest.mark.integration
def test_elastic_pytorchjob_pods_meet_through_c10d(tmp_path: Path) -> None:
    """``PET_NNODES=1:2`` with the c10d rendezvous at ``train-worker-0:23456``: both pods
    meet in one world of 2 pods x 2 workers."""
    _need_namespaces()
    out = _run(injected(manifest("pytorchjob-elastic.yaml")), tmp_path)
    lines = parse_reduce(out)
    check_world(lines, 4, reduced=True, context=out)
    assert {line.node for line in lines} == {"train-worker-0", "train-worker-1"}, out


@pytest.mark.integration
def test_trainjob_pods_under_torchrun_form_a_world_of_four(tmp_path: Path) -> None:
    """The reference for the two tests above: Trainer v2's default command, ``torchrun
    train.py`` with no flags, in the same simulated pods, forms the world of 4 that ``unirank
    run train.py`` must form (so the pods and variables are right)."""
    _need_namespaces()
    pods = [Pod(p.name, p.environ, ["torchrun", "train.py"])
            for p in injected(manifest("trainjob.yaml"))]
    out = _run(pods, tmp_path)
    check_world(parse_reduce(out), 4, addr="train-node-0-0.train", port=29500,
                nodes=["train-node-0-0"] * 2 + ["train-node-0-1"] * 2, reduced=True,
                context=out)


#: the TrainJob command that works before ``unirank run`` reads PET_* (docs/kubernetes.md):
#: Kubernetes expands each $(PET_...) from the variables the torch plugin set
SPELLED_OUT = ["unirank", "run", "--nnodes", "$(PET_NNODES)", "--node-rank", "$(PET_NODE_RANK)",
               "--master-addr", "$(PET_MASTER_ADDR)", "--master-port", "$(PET_MASTER_PORT)",
               "--nproc-per-node", "$(PET_NPROC_PER_NODE)", "train.py"]


def test_docs_show_the_spelled_out_command() -> None:
    shown = "command: [" + ", ".join(f'"{a}"' for a in SPELLED_OUT) + "]"
    assert shown in DOC.read_text()


@pytest.mark.integration
def test_trainjob_pods_with_the_options_spelled_out_form_a_world_of_four(tmp_path: Path) -> None:
    _need_namespaces()
    pods = [Pod(p.name, p.environ, SPELLED_OUT) for p in injected(manifest("trainjob.yaml"))]
    out = _run(pods, tmp_path)
    check_world(parse_reduce(out), 4, addr="train-node-0-0.train", port=29500,
                nodes=["train-node-0-0"] * 2 + ["train-node-0-1"] * 2, reduced=True,
                context=out)


@pytest.mark.integration
def test_elastic_pytorchjob_pods_under_torchrun_meet_through_c10d(tmp_path: Path) -> None:
    """The reference for the elastic test above: torchrun, reading the same ``PET_*``
    variables, forms one world of 2 pods x 2 workers in the same simulated pods (after its
    last call, about 30 s)."""
    _need_namespaces()
    pods = [Pod(p.name, p.environ, ["torchrun", "train.py"])
            for p in injected(manifest("pytorchjob-elastic.yaml"))]
    out = _run(pods, tmp_path)
    lines = parse_reduce(out)
    check_world(lines, 4, reduced=True, context=out)
    assert {line.node for line in lines} == {"train-worker-0", "train-worker-1"}, out
