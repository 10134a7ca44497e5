"""The local checks: pure functions of one rank's :class:`~unirank.doctor.facts.Facts`, each
returning one :class:`~unirank.doctor.result.Check` with its hint (or None where it does not
apply). :func:`local_checks` runs them all in table order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from unirank import netroute
from unirank.doctor.facts import Facts
from unirank.doctor.result import FAIL, OK, WARN, Check
from unirank.gpus import nccl_fits
from unirank.words import counted

__all__ = ["SLOW_LOOKUP", "ifname_matches", "local_checks"]

#: a reverse look-up slower than this (seconds) stalls torch's store connections
SLOW_LOOKUP = 1.0
#: interfaces NCCL leaves out unless NCCL_SOCKET_IFNAME names them
NCCL_EXCLUDED = ("lo", "docker")


def check_launch(facts: Facts) -> Check:
    """Launcher detection worked, and this is not an allocation shell that must srun first."""
    if facts.env_error is not None:
        exc = facts.env_error
        what = f"{exc.variable}={exc.value!r}: {exc.message}" if exc.variable else exc.message
        return Check("launcher", FAIL, what, exc.hint or "")
    env = facts.env
    assert env is not None
    if env.must_launch and facts.spawn is None:
        tasks = env.planned_tasks or env.num_nodes
        return Check("launcher", FAIL,
                     f"a Slurm allocation shell holding {counted(tasks, 'task')}, but no task was "
                     "launched "
                     "(a plain python here runs alone)",
                     "start the tasks with: srun unirank doctor (and srun your script)")
    return Check("launcher", OK, f"{env.launcher}: rank {env.rank} of {env.world_size}, "
                 f"{counted(env.num_nodes, 'node')}, node {facts.node}")


def check_world(facts: Facts) -> Check | None:
    """The detected world is as large as the launcher says it started (a node whose detection
    failed believes it is a world of one)."""
    if facts.env is None or facts.expected_tasks is None or facts.spawn is not None:
        return None
    variable, count = facts.expected_tasks
    if facts.env.world_size == count:
        return Check("world size", OK, f"{counted(count, 'rank')}, as {variable} says")
    return Check("world size", FAIL,
                 f"{variable}={count} tasks were started, but this rank detected a world of "
                 f"{facts.env.world_size} ({facts.env.launcher}): each rank would wait alone or "
                 "for ranks that are not there",
                 "export UNIRANK_LAUNCHER=<the launcher that started the tasks> (e.g. slurm), "
                 "or unset stale RANK/WORLD_SIZE variables")


def check_gpus(facts: Facts) -> Check | None:
    """Tasks per node vs visible GPUs vs the backend, by the runtime's rule
    (:func:`unirank.gpus.nccl_fits`): nccl needs a GPU per rank; ``auto`` picks nccl exactly
    when it fits (and torch has a CUDA build)."""
    if facts.env is None:
        return None
    ranks = facts.spawn or facts.env.local_world_size
    cuda_build = facts.versions is not None and facts.versions.torch_cuda is not None
    layout = (f"{counted(ranks, 'rank')} on this node, {counted(facts.gpus, 'GPU')} visible to "
              "this process") + (
        ", bound per task" if facts.per_task_gpus else "")
    fits = nccl_fits(facts.gpus, ranks, per_task_gpus=facts.per_task_gpus)
    if facts.backend != "nccl":
        auto = "nccl" if cuda_build and fits else "gloo"
        what = f"{layout}; backend {facts.backend}" + (
            f" (picks {auto})" if facts.backend == "auto" else "")
        return Check("gpus", OK, what)
    if not cuda_build or facts.gpus == 0:
        why = "torch has no CUDA build" if not cuda_build else "no GPU is visible"
        return Check("gpus", FAIL, f"{layout}; nccl needs a GPU per rank but {why}",
                     "--backend gloo, or request GPUs: srun --gpus-per-task=1 "
                     "(or check CUDA_VISIBLE_DEVICES)")
    if not fits:
        return Check("gpus", FAIL, f"{layout}; nccl needs a GPU per rank, so "
                     f"{counted(ranks - facts.gpus, 'rank')} would share one",
                     f"--ntasks-per-node={facts.gpus} (or -n {facts.gpus}), or --backend gloo")
    return Check("gpus", OK, f"{layout}; backend nccl")


def check_resolve(facts: Facts) -> Check | None:
    """The master address resolves (and how long it took)."""
    if facts.master is None or facts.env is None:
        return None
    source = facts.env.sources.get("master_addr", "MASTER_ADDR")
    took = f"{facts.master.seconds * 1000:.0f} ms"
    if facts.master.answer is None:
        return Check("master address", FAIL,
                     f"{facts.master.query!r} (from {source}) does not resolve "
                     f"({facts.master.error}, {took})",
                     "export MASTER_ADDR=<a host name or address every node resolves, e.g. "
                     "the first node's>")
    return Check("master address", OK,
                 f"{facts.master.query} -> {', '.join(facts.master.answer)} ({took})")


def check_reach(facts: Facts) -> Check | None:
    """The master's host answers from this node (a TCP connect to the master port)."""
    if facts.master is None or not facts.master.answer or facts.env is None:
        return None
    where = f"{facts.master.answer[0]}:{facts.env.master_port}"
    if facts.probe is None:
        return Check("master reachable", OK, f"{where} is this host")
    if facts.probe in ("listening", "refused"):
        how = "something listens" if facts.probe == "listening" else \
            "host answers, nothing listens yet"
        return Check("master reachable", OK, f"{where}: {how}")
    return Check("master reachable", FAIL, f"{where}: {facts.probe} from this node",
                 "open MASTER_PORT in the firewall between the nodes, or export MASTER_ADDR="
                 "<an address of the first node on a network every node shares>")


def check_port(facts: Facts) -> Check | None:
    """The master port is free where the store will listen, and not an ephemeral port."""
    if facts.env is None or facts.env.master_port is None:
        return None
    port = facts.env.master_port
    if facts.port_free is False:
        owner = facts.port_owner or "unknown (not readable here)"
        return Check("master port", FAIL, f"{port} is already in use on this host, by {owner}",
                     "export MASTER_PORT=<a free port, the same on every rank>")
    if facts.agent_store:
        return Check("master port", OK, f"{port} (already bound by the launcher's agent)")
    if facts.port_picked:
        return Check("master port", OK, f"{port} (free: picked for these ranks, as unirank "
                     "run picks one on a single node)")
    low, high = facts.ephemeral or (0, -1)
    if low <= port <= high:
        return Check("master port", WARN,
                     f"{port} is in the ephemeral range {low}-{high} "
                     "(/proc/sys/net/ipv4/ip_local_port_range): an outgoing connection may "
                     "take it", f"export MASTER_PORT=<a port below {low}, e.g. 29500>")
    free = "free" if facts.port_free else "not served from this rank"
    return Check("master port", OK, f"{port} ({free})")


def ifname_matches(spec: str, names: Sequence[str]) -> list[str]:
    """The interfaces of ``names`` that NCCL's ``NCCL_SOCKET_IFNAME`` syntax ``spec`` selects:
    a comma list of prefixes, ``=`` before the list for exact names, ``^`` for exclusion."""
    exclude = spec.startswith("^")
    spec = spec.removeprefix("^")
    exact = spec.startswith("=")
    items = [item.strip() for item in spec.removeprefix("=").split(",") if item.strip()]

    def hit(name: str) -> bool:
        return any(name == item if exact else name.startswith(item) for item in items)

    return [name for name in names if hit(name) != exclude]


def check_ifnames(facts: Facts) -> list[Check]:
    """NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME name interfaces that exist here."""
    names = sorted(facts.interfaces)
    suggest = _route_iface(facts) or "<an interface of: " + ", ".join(names) + ">"
    rows = []
    for variable, spec in facts.ifname_vars.items():
        if variable == "GLOO_SOCKET_IFNAME":
            wanted = [item.strip() for item in spec.split(",") if item.strip()]
            missing = [item for item in wanted if item not in facts.interfaces]
            picked = [item for item in wanted if item in facts.interfaces]
        else:
            picked = ifname_matches(spec, names)
            missing = [] if picked else [spec]
        if missing:
            rows.append(Check(variable, FAIL,
                              f"{spec!r}: no interface {', '.join(missing)} on this node "
                              f"(it has {', '.join(names)})",
                              f"export {variable}={suggest}"))
        else:
            rows.append(Check(variable, OK, f"{spec!r} selects {', '.join(picked)}"))
    return rows


def _route_iface(facts: Facts) -> str | None:
    """The interface holding the address this node sends from to the master."""
    return netroute.holder(facts.route_ip, facts.interfaces)


def check_route(facts: Facts) -> Check | None:
    """Which interface routes to the master, suggested as NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME."""
    if facts.master is None or not facts.master.answer:
        return None
    iface = _route_iface(facts)
    target = facts.master.answer[0]
    if iface is None:
        return Check("route to master", FAIL, f"no route from this node to {target}",
                     "export MASTER_ADDR=<an address of the first node this node can reach>")
    detail = f"{iface} ({facts.route_ip}) routes to {target}"
    here = netroute.is_own(target, facts.interfaces)
    if iface.startswith(NCCL_EXCLUDED) and not here:
        return Check("route to master", WARN, f"{detail}; NCCL leaves {iface} out by default",
                     f"export NCCL_SOCKET_IFNAME={iface}")
    if facts.ifname_vars or iface.startswith(NCCL_EXCLUDED):
        return Check("route to master", OK, detail)
    return Check("route to master", OK,
                 f"{detail} (to pin it: NCCL_SOCKET_IFNAME={iface} GLOO_SOCKET_IFNAME={iface})")


def check_reverse(facts: Facts) -> Check | None:
    """Reverse look-ups of the master's address (and its IPv4-mapped form) answer quickly."""
    if not facts.reverse:
        return None
    slow = [r for r in facts.reverse if r.seconds > SLOW_LOOKUP]
    timing = ", ".join(f"{r.query}: {r.answer[0] if r.answer else 'no name'} "
                       f"({r.seconds * 1000:.0f} ms)" for r in facts.reverse)
    if not slow:
        return Check("reverse lookup", OK, timing)
    ip = facts.reverse[0].query
    name = facts.master.query if facts.master else ip
    return Check("reverse lookup", WARN,
                 f"{timing}: slow look-ups stall torch's store connections",
                 f"add the line '{ip} {name}' to /etc/hosts on every node")


def check_torch(facts: Facts) -> Check:
    """torch is installed, and built with CUDA when nccl is asked for."""
    v = facts.versions
    if v is None or v.torch is None:
        return Check("torch", FAIL, "torch is not installed for " + (v.python if v else "python"),
                     "pip install torch")
    build = f"CUDA {v.torch_cuda}, NCCL" if v.torch_cuda else "CPU only (gloo)"
    return Check("torch", OK, f"torch {v.torch} ({build}), unirank {v.unirank}, "
                 f"python {v.python}")


_CHECKS: tuple[Callable[[Facts], Check | list[Check] | None], ...] = (
    check_launch, check_world, check_gpus, check_torch, check_resolve, check_reach,
    check_port, check_ifnames, check_route, check_reverse,
)


def local_checks(facts: Facts) -> list[Check]:
    """Every local check, in table order."""
    rows: list[Check] = []
    for check in _CHECKS:
        result = check(facts)
        if isinstance(result, Check):
            rows.append(result)
        elif result:
            rows.extend(result)
    return rows

