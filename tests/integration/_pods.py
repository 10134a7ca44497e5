"""Kubernetes pods simulated on loopback (no cluster can run here; see the Kubernetes tests).

:func:`injected` is what the operators add to a pod's environment, from the manifests of
examples/kubernetes, as their source gives it (Kubeflow training operator v1.7+
``pkg/controller.v1/pytorch/envvar.go`` and ``elastic.go``; Trainer v2's torch plugin
``pkg/runtime/framework/plugins/torch/torch.go``). :func:`run_pods` starts the pods at once in a
private network and mount namespace (``unshare -m -n``, root only): loopback up, a copy of
/etc/hosts bind-mounted over it that names each pod (pod ``i`` is ``127.0.0.(i+1)``), and each
pod in a UTS namespace of its own whose host name is the pod's name, as in Kubernetes;
``$(NAME)`` in a pod's command is expanded from its environment (:func:`expand`), as Kubernetes
does.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from _procs import launcher_free_environ, process_tree

MANIFESTS = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"
#: the training operator's default port (its defaulting webhook adds it to the pytorch container)
V1_PORT = 23456
#: Trainer v2's container port (constants.ContainerTrainerPort)
V2_PORT = 29500


def manifest(name: str) -> list[dict[str, Any]]:
    """The documents of ``examples/kubernetes/<name>``."""
    return list(yaml.safe_load_all((MANIFESTS / name).read_text()))


def pod_specs(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pod spec of each of a PyTorchJob's replica specs or a TrainingRuntime's replicated
    jobs."""
    spec = doc["spec"]
    if doc["kind"] == "PyTorchJob":
        templates = [r["template"] for r in spec["pytorchReplicaSpecs"].values()]
    else:
        templates = [j["template"]["spec"]["template"] for j in
                     spec["template"]["spec"]["replicatedJobs"]]
    return [t["spec"] for t in templates]


def containers(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every container of a PyTorchJob's replica specs or a TrainingRuntime's replicated jobs."""
    return [c for spec in pod_specs(doc) for c in spec["containers"]]


@dataclass(frozen=True)
class Pod:
    """One pod: its name (and host name), its environment from the operator, its command."""

    name: str
    environ: Mapping[str, str]
    command: Sequence[str]


def _pytorchjob_pods(job: Mapping[str, Any]) -> list[Pod]:
    name, spec = job["metadata"]["name"], job["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    total = sum(int(r["replicas"]) for r in replicas.values())
    elastic = spec.get("elasticPolicy")
    pods: list[Pod] = []
    for rtype in ("Master", "Worker"):
        if rtype not in replicas:
            continue
        command = replicas[rtype]["template"]["spec"]["containers"][0]["command"]
        for index in range(int(replicas[rtype]["replicas"])):
            env = {"PYTHONUNBUFFERED": "0"}
            if "Master" in replicas:
                rank = index + (1 if rtype == "Worker" else 0)
                env.update(MASTER_ADDR=f"{name}-master-0", MASTER_PORT=str(V1_PORT),
                           WORLD_SIZE=str(total), RANK=str(rank))
            if elastic is not None:
                env.update(PET_RDZV_ENDPOINT=f"{name}-worker-0:{V1_PORT}",
                           PET_RDZV_BACKEND=elastic.get("rdzvBackend", "c10d"),
                           PET_NNODES=f"{elastic['minReplicas']}:{elastic['maxReplicas']}")
                if "maxRestarts" in elastic:
                    env["PET_MAX_RESTARTS"] = str(elastic["maxRestarts"])
            if "nprocPerNode" in spec:
                env["PET_NPROC_PER_NODE"] = str(spec["nprocPerNode"])
            pods.append(Pod(f"{name}-{rtype.lower()}-{index}", env, command))
    return pods


def _trainjob_pods(docs: Sequence[Mapping[str, Any]]) -> list[Pod]:
    runtime = next(d for d in docs if d["kind"] == "TrainingRuntime")
    job = next(d for d in docs if d["kind"] == "TrainJob")
    name, trainer = job["metadata"]["name"], job["spec"]["trainer"]
    policy = runtime["spec"]["mlPolicy"]
    nodes = int(trainer.get("numNodes", policy["numNodes"]))
    nproc = str(trainer.get("numProcPerNode", policy["torch"]["numProcPerNode"]))
    command = trainer.get("command") or containers(runtime)[0]["command"]
    return [Pod(f"{name}-node-0-{index}",
                {"PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": nproc,
                 "PET_NODE_RANK": str(index), "PET_MASTER_ADDR": f"{name}-node-0-0.{name}",
                 "PET_MASTER_PORT": str(V2_PORT)}, command)
            for index in range(nodes)]


def injected(docs: Sequence[Mapping[str, Any]]) -> list[Pod]:
    """The pods the operator makes of a manifest's documents, with what it injects."""
    kinds = {d["kind"] for d in docs}
    if "PyTorchJob" in kinds:
        return _pytorchjob_pods(next(d for d in docs if d["kind"] == "PyTorchJob"))
    return _trainjob_pods(docs)


def expand(arg: str, environ: Mapping[str, str]) -> str:
    """``arg`` with every ``$(NAME)`` of ``environ`` replaced by its value, as Kubernetes
    expands a container's command and args (an unknown name stays as written)."""
    for name, value in environ.items():
        arg = arg.replace(f"$({name})", value)
    return arg


def hosts_file(pods: Sequence[Pod], addresses: Sequence[str] = ()) -> str:
    """/etc/hosts of the simulated cluster: pod ``i`` at ``addresses[i]`` (default
    127.0.0.(i+1)), also under its headless service's name (``<pod>.<subdomain>``, as JobSet
    gives it)."""
    lines = ["127.0.0.1 localhost"]
    for index, pod in enumerate(pods):
        job = pod.name.split("-node-")[0] if "-node-" in pod.name else None
        names = [pod.name] + ([f"{pod.name}.{job}"] if job else [])
        addr = addresses[index] if addresses else f"127.0.0.{index + 1}"
        lines.append(f"{addr} {' '.join(names)}")
    return "\n".join(lines) + "\n"


def run_pods(pods: Sequence[Pod], cwd: Path, *, timeout: float,
             extra: Mapping[str, str] | None = None) -> tuple[list[int], list[str]]:
    """Start every pod at once in a private network (see the module docstring); each pod's
    exit code and output. Fails, after killing them all, when they run past ``timeout``."""
    hosts = cwd / "hosts"
    hosts.write_text(hosts_file(pods))
    lines = ["mount --bind " + shlex.quote(str(hosts)) + " /etc/hosts", "ip link set lo up"]
    for index, pod in enumerate(pods):
        argv = " ".join(shlex.quote(a) for a in pod_argv(pod, extra))
        lines.append(f"{argv} > pod{index}.log 2>&1 & p{index}=$!")
    for index in range(len(pods)):
        lines.append(f"wait $p{index}; echo \"POD {index} $?\"")
    proc = subprocess.Popen(["unshare", "-m", "-n", "bash", "-c", "\n".join(lines)], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out = proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        logs = [(cwd / f"pod{i}.log").read_text() for i in range(len(pods))]
        raise AssertionError(f"the pods did not end in {timeout:g} s; killed\n{logs}") from None
    codes = {int(w.split()[1]): int(w.split()[2]) for w in out.splitlines()
             if w.startswith("POD ")}
    assert sorted(codes) == list(range(len(pods))), out
    return [codes[i] for i in range(len(pods))], \
        [(cwd / f"pod{i}.log").read_text() for i in range(len(pods))]


def pod_argv(pod: Pod, extra: Mapping[str, str] | None = None) -> list[str]:
    """The command that runs ``pod`` once inside the cluster's namespaces: only the pod's
    environment (plus ``extra``), a UTS namespace whose host name is the pod's name, the
    container command with ``$(NAME)`` expanded."""
    env = launcher_free_environ({**pod.environ, **(extra or {})})
    inner = f"hostname {shlex.quote(pod.name)} && exec \"$@\""
    return ["env", "-i", *(f"{k}={v}" for k, v in env.items()), "unshare", "-u",
            "sh", "-c", inner, "sh", *(expand(a, pod.environ) for a in pod.command)]


#: the bridge's network of a cluster whose pods have their own network namespace (RFC 2544's
#: benchmarking range: inside the private namespaces nothing is sent anywhere)
POD_NET = "198.18.0"


class Cluster:
    """A simulated cluster whose pods start, die and start again one at a time (what
    :func:`run_pods` does all at once): a holder process owns the private network and mount
    namespaces (see the module docstring) and each pod enters them with ``nsenter``, so a pod
    deleted and started again gets the same name, address and variables, as a replaced pod of
    the same index does. Use as a context manager; everything left is killed on exit.

    With ``own_network``, each pod also gets a network namespace of its own, as a Kubernetes
    pod has: a veth pair from a bridge in the holder's namespace, pod ``i`` at
    ``198.18.0.(i+1)`` (:data:`POD_NET`); no pod can bind or reach another pod's address as its
    own. :meth:`start` may then give a pod started again another address (a replaced pod gets a
    new IP): /etc/hosts, shared by every pod as a cluster's DNS is, names the new one."""

    def __init__(self, pods: Sequence[Pod], cwd: Path, *,
                 extra: Mapping[str, str] | None = None, own_network: bool = False) -> None:
        self.pods, self.cwd, self.extra = list(pods), cwd, extra
        self.addresses = [f"{POD_NET}.{i + 1}" for i in range(len(pods))] if own_network \
            else []
        (cwd / "hosts").write_text(hosts_file(pods, self.addresses))
        bridge = f" && ip link add br0 type bridge && ip addr add {POD_NET}.254/24 dev br0" \
                 " && ip link set br0 up" if own_network else ""
        setup = f"mount --bind {shlex.quote(str(cwd / 'hosts'))} /etc/hosts && " \
                f"ip link set lo up{bridge} && echo up && exec cat"
        self.holder = subprocess.Popen(["unshare", "-m", "-n", "bash", "-c", setup], cwd=cwd,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.holder.stdout is not None
        assert self.holder.stdout.readline() == "up\n", "the cluster's namespaces failed"
        self.running: dict[int, subprocess.Popen[str]] = {}
        self.starts = [0] * len(self.pods)

    def start(self, index: int, addr: str | None = None) -> subprocess.Popen[str]:
        """Start pod ``index`` (again; at ``addr`` where given, with ``own_network``); its
        output goes to ``pod<index>.<n>.log``."""
        log = self.cwd / f"pod{index}.{self.starts[index]}.log"
        self.starts[index] += 1
        argv = pod_argv(self.pods[index], self.extra)
        if self.addresses:
            if addr is not None:
                self.addresses[index] = addr
                (self.cwd / "hosts").write_text(hosts_file(self.pods, self.addresses))
            return self._start_own(index, argv, log)
        with log.open("w") as out:
            proc = subprocess.Popen(
                ["nsenter", "-t", str(self.holder.pid), "-m", "-n", f"--wd={self.cwd}", *argv],
                cwd=self.cwd, stdout=out, stderr=subprocess.STDOUT, text=True,
                start_new_session=True)
        self.running[index] = proc
        return proc

    def _start_own(self, index: int, argv: Sequence[str], log: Path) -> subprocess.Popen[str]:
        """Start a pod in a network namespace of its own: once there it says so on a pipe and
        waits on stdin until its end of a fresh veth pair was moved in, sets its address, then
        runs ``argv``."""
        link = f"p{index}x{self.starts[index]}"
        holder = ["nsenter", "-t", str(self.holder.pid), "-n"]
        # a pod's MAC follows its address: one started again at the same address is the same
        # host to the others' neighbour tables (they would wait out a stale entry otherwise)
        mac = "02:00:" + ":".join(f"{int(b):02x}" for b in self.addresses[index].split("."))
        subprocess.run([*holder, "ip", "link", "add", f"h{link}", "type", "veth", "peer",
                        "name", link, "address", mac], check=True)
        subprocess.run([*holder, "ip", "link", "set", f"h{link}", "master", "br0", "up"],
                       check=True)
        ready_r, ready_w = os.pipe()
        inner = f"echo in >&{ready_w} && exec {ready_w}>&- && read go && ip link set lo up " \
                f"&& ip addr add {self.addresses[index]}/24 " \
                f"dev {link} && ip link set {link} up && exec \"$@\""
        with log.open("w") as out:
            proc = subprocess.Popen(
                ["nsenter", "-t", str(self.holder.pid), "-m", "-n", f"--wd={self.cwd}",
                 "unshare", "-n", "bash", "-c", inner, "bash", *argv],
                cwd=self.cwd, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                text=True, start_new_session=True, pass_fds=(ready_w,))
        os.close(ready_w)
        with os.fdopen(ready_r) as ready:
            assert ready.readline() == "in\n", "a pod's network namespace failed"
        subprocess.run([*holder, "ip", "link", "set", link, "netns", str(proc.pid)],
                       check=True)
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.close()
        self.running[index] = proc
        return proc

    def kill(self, index: int, timeout: float) -> int:
        """SIGKILL pod ``index``'s whole process tree (a deleted pod past its grace period);
        its exit code."""
        proc = self.running.pop(index)
        for pid in process_tree(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return proc.wait(timeout=timeout)

    def log(self, index: int, start: int) -> str:
        return (self.cwd / f"pod{index}.{start}.log").read_text()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        for index in list(self.running):
            if self.running[index].poll() is None:
                self.kill(index, 30)
        assert self.holder.stdin is not None
        self.holder.stdin.close()
        self.holder.wait(timeout=30)
