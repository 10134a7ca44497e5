"""A successor's probe (:func:`probe_loop`, a thread of its server): where else this job is
served. No torch; reads no environment variable.

Once per beat interval it connects to the original endpoint (its name resolved afresh each
time) and to the other members' rendezvous ports, tells whatever serves there where this job
runs (``redirect``) and reads where that one runs (``here``); the one behind follows the other
(:func:`.rounds.follows`: a node started again with the original command, or the other side of
a split that healed). The probed server's side is :meth:`.server.Server._redirect`.
"""

from __future__ import annotations

import contextlib
import socket
import time
from typing import Any, Protocol

from unirank.supervisor.rdzv.messages import authentic, place_tag
from unirank.supervisor.rdzv.rounds import Served, follows
from unirank.supervisor.rdzv.spec import RdzvSpec
from unirank.supervisor.rdzv.wire import Lines

__all__ = ["Probing", "answer", "probe_loop", "served"]


class Probing(Protocol):
    """What the probe reads of its server (:class:`.server.Server`) and leaves there."""

    spec: RdzvSpec
    host: str
    round: int
    members: tuple[str, ...]
    records: dict[str, dict[str, Any]]
    moved: dict[str, Any] | None
    found: dict[str, Any] | None

    def here(self) -> dict[str, Any]:
        """Where this server's job runs (its probe's message)."""

    def point_to(self, there: dict[str, Any]) -> None:
        """Send every node there, and every later hello."""


def answer(server: Probing, lines: Lines, there: dict[str, Any]) -> None:
    """A probe (``there``: where its prober says the job runs) read by ``server`` on
    ``lines``: answered with where ``server``'s job runs, and followed where
    :func:`.rounds.follows` says so (every node of ``server`` is sent there, and so is every
    later hello). A probe whose prober closed its connection already is stale (it waited in
    the queue of a rendezvous port nothing served yet; its server may be gone): ignored, as a
    live prober probes again each beat; so is one without the job's secret where there is one.
    Without a secret, a server that closed a round follows only a node of its job it knows, at
    the address that node joined with (anyone who reaches the port could name any address).
    The caller closes ``lines``."""
    spec = server.spec
    if lines.peer_gone() or \
            (spec.secret and not authentic(there.get("auth"),
                                           place_tag(spec, "redirect", there))):
        return
    here = server.moved or server.here()
    trusted = bool(spec.secret) or server.round < 0
    follow = False
    with contextlib.suppress(KeyError, TypeError, ValueError):
        follow = bool(there.get("addr")) and _later(server, here, there) and (
            trusted or server.records.get(str(there["server"]), {}).get("addr") == there["addr"])
    shown = there if follow else here  # never point a prober this server leaves at the one before
    signed = {"auth": place_tag(spec, "here", shown)} if spec.secret else {}
    lines.send({"here": shown, **signed})  # the prober follows where it is behind
    with contextlib.suppress(KeyError, TypeError, ValueError):
        if follow:
            server.point_to(there)


def served(state: dict[str, Any]) -> Served:
    """A server's state as a probe and its answer carry it (:meth:`.server.Server.here`)."""
    return Served(str(state["job"]), int(state["round"]), str(state["server"]),
                  int(state.get("place") or 0))


def _later(server: Probing, here: dict[str, Any], there: dict[str, Any]) -> bool:
    """Whether ``server`` (now at ``here``) sends its nodes to ``there``: by
    :func:`.rounds.follows`; a server that followed another also follows a successor of that
    one (another server of the job at the same round or later: a successor serves only once the
    one before it is lost)."""
    if server.moved is not None and str(there["job"]) == str(here["job"]) and \
            str(there["server"]) != str(here["server"]) and \
            int(there["round"]) >= int(here["round"]):
        return True
    return follows(served(here), served(there))


def _ask(server: Probing, address: tuple[str, int]) -> dict[str, Any] | None:
    """Probe the server at ``address`` once: where it says its job runs (None: no answer,
    or one without the job's secret where there is one)."""
    interval, spec = server.spec.keep_alive_interval, server.spec
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError), \
            socket.create_connection(address, timeout=interval) as sock:
        lines = Lines(sock)
        sock.settimeout(interval)
        here = server.here()
        signed = {"auth": place_tag(spec, "redirect", here)} if spec.secret else {}
        lines.send({"op": "redirect", **here, **signed})
        answer = (lines.receive() or [{}])[0]
        there = answer.get("here")
        if isinstance(there, dict) and there.get("addr") and there.get("job") == spec.run_id \
                and (not spec.secret or authentic(answer.get("auth"),
                                                  place_tag(spec, "here", there))):
            return there
    return None


def probe_loop(server: Probing) -> None:
    """Probe until ``server`` followed another (one that followed says nothing); a later
    server found is left in ``server.found`` (its loop follows it: one thread sends)."""
    interval = server.spec.keep_alive_interval
    while server.moved is None:
        members, records = server.members, dict(server.records)  # the loop replaces them
        others = [(str(records[m]["addr"]), int(records[m]["rdzv_port"])) for m in members
                  if m != server.host and records.get(m, {}).get("rdzv_port")]
        for address in [(server.spec.endpoint_host, server.spec.endpoint_port), *others]:
            there = _ask(server, address)
            with contextlib.suppress(ValueError, KeyError, TypeError):
                if there is not None and follows(served(server.here()), served(there)):
                    server.found = there
        time.sleep(interval)  # a period, not a synchronisation
