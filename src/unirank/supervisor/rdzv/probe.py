"""A successor's probe (:func:`probe_loop`, a thread of its server): where else this job is
served. No torch; reads no environment variable.

Once per beat interval it connects to the original endpoint (its name resolved afresh each
time) and to the rendezvous ports of the members not connected to it (:func:`targets`: a node
connected here serves no other side, and a job of thousands whose nodes are all here probes only
the endpoint), tells whatever serves there where this job runs (``redirect``) and reads where
that one runs (``here``); the one behind follows the other (:func:`.rounds.follows`: a node
started again with the original command, or the other side of a split that healed). The probed
server's side is :meth:`.server.Server._redirect`. A member whose rendezvous port refuses the
connection is proven dead (its helper, which holds that port open from its start to its end, is
gone: :func:`.rounds.has_quorum`): the server then neither waits for it nor counts it in a
quorum (fault seed 14: the serving node and another killed at once; the successor counted the
other alive for its whole grace, 11 s, and no round closed in time).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

from unirank.supervisor.rdzv.messages import authentic, place_tag
from unirank.supervisor.rdzv.rounds import Served, follows
from unirank.supervisor.rdzv.spec import RdzvSpec
from unirank.supervisor.rdzv.wire import Lines

__all__ = ["Probing", "probe_loop", "rdzv_address", "served", "targets"]


class Probing(Protocol):
    """What the probe reads of its server (:class:`.server.Server`) and leaves there."""

    spec: RdzvSpec
    host: str
    members: tuple[str, ...]
    records: dict[str, dict[str, Any]]
    moved: dict[str, Any] | None
    found: dict[str, Any] | None

    def here(self) -> dict[str, Any]:
        """Where this server's job runs (its probe's message)."""

    def connected(self) -> frozenset[str]:
        """The nodes connected to this server now."""

    def proven_dead(self) -> frozenset[str]:
        """The nodes this server knows proven dead (never followed)."""

    def refused(self, node: str) -> None:
        """The rendezvous port of ``node``, a member of the last round, refused the probe."""

    @property
    def retired(self) -> bool:
        """Whether the server stopped serving (:meth:`.server.Server.retire`)."""


def served(state: dict[str, Any]) -> Served:
    """A server's state as a probe and its answer carry it (:meth:`.server.Server.here`)."""
    return Served(str(state["job"]), int(state["round"]), str(state["server"]),
                  int(state.get("place") or 0))


def targets(spec: RdzvSpec, host: str, members: Sequence[str],
            records: Mapping[str, Mapping[str, Any]],
            connected: Collection[str]) -> list[tuple[str, int]]:
    """Where a successor's probe goes, in order: the original endpoint, then the rendezvous
    port of each member of the last round (in its order: the other side's successor is the
    first of its nodes) that is neither this server's node nor connected here."""
    others = [rdzv_address(records[m]) for m in members
              if m != host and m not in connected and records.get(m, {}).get("rdzv_port")]
    return [(spec.endpoint_host, spec.endpoint_port), *others]


def rdzv_address(record: Mapping[str, Any]) -> tuple[str, int]:
    """Where a member's rendezvous port is, from its record."""
    return str(record["addr"]), int(record["rdzv_port"])


def probe_loop(server: Probing) -> None:
    """Probe until ``server`` followed another (one that followed says nothing) or retired;
    a later server found is left in ``server.found`` (its loop follows it: one thread sends)."""
    interval = server.spec.keep_alive_interval
    while server.moved is None and not server.retired:
        members, records = server.members, dict(server.records)  # the loop replaces them
        owners = {rdzv_address(records[m]): m for m in members
                  if records.get(m, {}).get("rdzv_port")}
        for address in targets(server.spec, server.host, members, records,
                               server.connected()):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                _probe(server, address, interval, owners.get(address))
        time.sleep(interval)  # a period, not a synchronisation


def _probe(server: Probing, address: tuple[str, int], interval: float,
           member: str | None) -> None:
    """One probe of ``address``: ``member``'s rendezvous port (None: the endpoint)."""
    try:
        sock = socket.create_connection(address, timeout=interval)
    except ConnectionRefusedError:
        if member is not None:
            server.refused(member)
        return
    with sock:
        lines = Lines(sock)
        sock.settimeout(interval)
        here, spec = server.here(), server.spec
        signed = {"auth": place_tag(spec, "redirect", here)} if spec.secret else {}
        lines.send({"op": "redirect", **here, **signed})
        answer = (lines.receive() or [{}])[0]
        there = answer.get("here")
        if isinstance(there, dict) and there.get("addr") and \
                (not spec.secret or authentic(answer.get("auth"),
                                              place_tag(spec, "here", there))) and \
                follows(served(server.here()), served(there), server.proven_dead()):
            server.found = there
