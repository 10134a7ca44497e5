"""``unirank run``'s dynamic rendezvous: the same command on every node, node ranks assigned at
rendezvous (torchrun's ``--rdzv-backend c10d`` without ``--node-rank``), and ``--nnodes MIN:MAX``.

:func:`wanted` is THE rule for whether a run takes the dynamic rendezvous: ``--rdzv-backend
c10d``, no ``--node-rank``, no ``--standalone``, and ``--nnodes`` above one node (or a range);
under an outer launcher (srun, mpirun), which gives node ranks itself, the static rendezvous
stays, but for a range started one task per node (``unirank sbatch --nnodes MIN:MAX``).
``--rdzv-conf`` is read by :func:`unirank.supervisor.rdzv.conf.parse_rdzv_conf`. :func:`join`
starts the node's rendezvous helper (:class:`~unirank.supervisor.rdzv.client.RendezvousHelper`),
opens the store's socket the node serves should it be node rank 0, and waits for this node's
:class:`~unirank.supervisor.rdzv.spec.Assignment`.

Reads (from the mapping it is given): UNIRANK_MASTER_FORWARDED (through
:func:`unirank.resolve.require_own`).
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from unirank.distenv import DistEnv
from unirank.errors import ConfigError
from unirank.supervisor.rdzv.client import RendezvousHelper
from unirank.supervisor.rdzv.conf import KEYS, parse_rdzv_conf
from unirank.supervisor.rdzv.rounds import two_node_note
from unirank.supervisor.rdzv.spec import DEFAULT_ENDPOINT_PORT, Assignment, RdzvSpec
from unirank.words import counted

__all__ = ["DEFAULT_RUN_ID", "USED_OPTIONS", "asked", "describe_round", "eviction", "is_range",
           "join", "wanted"]

#: torchrun's ``--rdzv-id`` when none is given
DEFAULT_RUN_ID = "none"
#: options noted as having no effect elsewhere that the dynamic rendezvous uses
USED_OPTIONS = frozenset({"--local-addr"})


def asked(args: argparse.Namespace) -> bool:
    """Whether the options alone ask for the dynamic rendezvous (c10d, no ``--node-rank``, no
    ``--standalone``, more than one node or a range); :func:`wanted` decides."""
    from unirank.cli.counts import parse_nnodes_range

    if str(args.rdzv_backend).strip().lower() != "c10d" or args.node_rank is not None \
            or args.standalone or args.nnodes is None:
        return False
    least, most = parse_nnodes_range(str(args.nnodes))
    return most > 1 or least != most


def wanted(args: argparse.Namespace, outer: DistEnv) -> bool:
    """THE rule: whether this run takes the dynamic rendezvous (:func:`asked` for by the
    options), unless an outer launcher gives the node ranks: it does not for an elastic range
    ``MIN:MAX`` started one task per node (``unirank sbatch --nnodes MIN:MAX``'s steps), where
    each task is one node."""
    if not asked(args) or outer.launch_required:
        return False
    return outer.world_size <= 1 or (is_range(args) and outer.world_size == outer.num_nodes)


def is_range(args: argparse.Namespace) -> bool:
    """Whether ``--nnodes`` is an elastic range (``MIN:MAX`` with MIN below MAX)."""
    from unirank.cli.counts import parse_nnodes_range

    if args.nnodes is None:
        return False
    least, most = parse_nnodes_range(str(args.nnodes))
    return least != most


def _serves_endpoint(host: str, local_addr: str | None, environ: Mapping[str, str],
                     outer: DistEnv) -> bool:
    """Whether this node is on the endpoint's host: its ``--local-addr`` is the endpoint's
    host; or (without one) under an outer launcher that names the node (srun's
    SLURMD_NODENAME), the node's name is the endpoint's host or shares an address with it
    (several nodes may share a machine); else the endpoint's host is one of this host's
    addresses."""
    if local_addr:
        return local_addr == host
    if outer.launcher != "local":
        from unirank.resolve import same_address

        return outer.node_name == host or same_address(outer.node_name, host)
    from unirank.resolve import require_own

    try:
        require_own(host, source="--rdzv-endpoint", environ=environ)
    except ConfigError:
        return False
    return True


def _spec(args: argparse.Namespace, endpoint: tuple[str | None, int | None], nproc: int,
          outer: DistEnv, environ: Mapping[str, str]) -> RdzvSpec:
    from unirank.cli.counts import parse_nnodes_range
    from unirank.resolve import require_resolvable
    from unirank.supervisor.rdzv.secret import secret_of

    conf = parse_rdzv_conf(args.rdzv_conf)
    host, port = endpoint
    if not host:
        raise ConfigError(
            "is needed for the c10d rendezvous without --node-rank",
            variable="--rdzv-endpoint", value=None,
            hint="give every node the same --rdzv-endpoint HOST:PORT, HOST being one of them")
    require_resolvable(host, source="--rdzv-endpoint")
    least, most = parse_nnodes_range(str(args.nnodes))
    local_addr = (args.noted_local_addr or "").strip() or None
    return RdzvSpec(
        endpoint_host=host, endpoint_port=port or DEFAULT_ENDPOINT_PORT,
        run_id=args.rdzv_id or DEFAULT_RUN_ID, min_nodes=least, max_nodes=most,
        local_addr=local_addr or outer.node_name, node_name=outer.node_name, nproc=nproc,
        serves_endpoint=_serves_endpoint(host, local_addr, environ, outer),
        explicit_addr=local_addr is not None, secret=secret_of(environ),
        **{key: getattr(conf, key) for key in KEYS})


def join(args: argparse.Namespace, endpoint: tuple[str | None, int | None], nproc: int,
         outer: DistEnv, environ: Mapping[str, str], stop_fd: int | None = None,
         ) -> tuple[RendezvousHelper, socket.socket, Assignment]:
    """Take part in the rendezvous: the helper (the caller closes it when the run ends), the
    store's socket (for node rank 0; others close it) and this node's assignment; a node
    waiting to join stops the workers so that the next round admits it, whatever is left of
    ``--max-restarts`` (a change of membership spends no restart, as under torchrun). A
    refusal is a one-line :class:`ConfigError`; a stop signal on ``stop_fd`` while a round is
    awaited ends the wait (:class:`~unirank.supervisor.rdzv.client.StoppedWaiting`)."""
    from unirank.supervisor.listen import open_store_socket

    spec = _spec(args, endpoint, nproc, outer, environ)
    note = two_node_note(spec.min_nodes, spec.max_nodes)
    if note is not None:  # what one world at every moment costs a two-node job: said once
        sys.stderr.write(f"unirank run: {note}\n")
        sys.stderr.flush()
    sock = open_store_socket(0, host=spec.master_addr(), option="--rdzv-endpoint")
    helper = None
    try:
        spec = replace(spec, store_port=int(sock.getsockname()[1]))
        helper = RendezvousHelper(spec, environ, stop_fd)
        return helper, sock, helper.next()
    except BaseException:
        sock.close()
        if helper is not None:
            helper.close()
        raise


def describe_round(before: Assignment, after: Assignment, took: float | None = None,
                   noticed: float | None = None) -> str:
    """One line on a new round: this node's place, the nodes that left or joined since
    ``before`` (by :func:`~unirank.supervisor.rdzv.names.node_label`; without the nodes'
    identities, by name, a name twice counting twice), how long the workers took to stop after
    the news (``noticed`` seconds before the rendezvous began, where there was news) and how
    long the round took to close (``took`` seconds, where given)."""
    from unirank.elasticstate import nodes_changed
    from unirank.supervisor.rdzv.names import node_labels

    if len(before.nodes) == before.nnodes and len(after.nodes) == after.nnodes:
        named = {**before.named(), **after.named()}
        left = tuple(node_labels([n for n in before.nodes if n not in after.nodes], named))
        joined = tuple(node_labels([n for n in after.nodes if n not in before.nodes], named))
    else:
        left, joined = nodes_changed(before.hosts, after.hosts)
    changes = [f"{what}: {', '.join(names)}"
               for what, names in (("left", left), ("joined", joined)) if names]
    return (f"rendezvous round {after.round}: node rank {after.node_rank} of {after.nnodes}, "
            f"{counted(sum(after.ranks_per_node), 'worker')} in all"
            + (f" ({'; '.join(changes)})" if changes else "")
            + (f", the workers stopped {noticed:.1f} s after the news" if noticed is not None
               else "")
            + (f", after {took:.1f} s of rendezvous" if took is not None else ""))


def eviction(place: Assignment, verdict: Mapping[str, Any] | None) -> dict[str, Any]:
    """The next round's eviction (``--on-hang evict``, ``--on-slow evict``), as
    :meth:`RendezvousHelper.next`'s keywords: the nodes (of ``place``, the round that ended)
    of the ranks the ``verdict`` leaves out (:func:`~unirank.supervisor.restartreason.
    evicted_ranks`), and why (``node evicted: rank 1 never entered all_reduce #12``);
    nothing without a verdict."""
    from unirank.supervisor.restartreason import evicted_ranks, evicted_why

    nodes = place.nodes_of(evicted_ranks(verdict))
    return {"evict": nodes, "why": evicted_why(verdict)} if nodes else {}
