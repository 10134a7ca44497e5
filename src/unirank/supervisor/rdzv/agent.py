"""The rendezvous helper of one node: ``python -m unirank.supervisor.rdzv.agent`` (imports
torch; the ``unirank run`` parent starts it through :mod:`.client`).

It reads one :class:`~.spec.RdzvSpec` (a JSON line) on stdin, then

1. serves the c10d store at the endpoint where this node is on the endpoint's host (another
   node of the host may serve it first: then it is a client, as torch's c10d backend), else
   connects to it; the node serving it records the job's ``--rdzv-id`` there, and a node of
   another job is refused;
2. claims this node's address in the rendezvous: a node started twice (its claim is held by a
   live helper, whose beat still advances) is refused;
3. runs torch's ``DynamicRendezvousHandler.next_rendezvous()`` (c10d backend; ``min_nodes``,
   ``max_nodes``, ``join_timeout``, ``last_call_timeout``, ``close_timeout`` and the keep-alive
   as torchrun passes them), then every node publishes a :class:`~.spec.NodeRecord` in the
   round's store and reads the others', and :func:`~.spec.assign` gives the node ranks;
4. answers the :class:`~.spec.Assignment` as one JSON line on stdout, and keeps the node alive
   in the rendezvous (torch's keep-alive thread) until stdin says ``next`` (join the next
   round) or ends (the parent is done or gone): then it leaves at once.

A refusal is answered as ``{"error": ..., "variable": ..., "value": ..., "hint": ...}`` (the
parent raises it as a one-line ConfigError). torch's own log lines go to stderr, which the
parent sends to a file. Reads no environment variable itself (torch reads
TORCH_DISABLE_SHARE_RDZV_TCP_STORE, which the parent sets to 1: the workers' store is served by
rank 0, as everywhere in unirank).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, NoReturn

from unirank.supervisor.rdzv.spec import Assignment, NodeRecord, RdzvSpec, assign, to_line

if TYPE_CHECKING:
    from torch.distributed import Store  # type: ignore[attr-defined]

__all__ = ["BEAT_INTERVAL", "JOB_KEY", "LOST_AFTER", "Refusal", "main"]

#: where the node serving the endpoint records its job's ``--rdzv-id``
JOB_KEY = "unirank.rdzv.job"
#: seconds between the beats of a node's claim on its address
BEAT_INTERVAL = 1.0
#: a peer whose beat did not advance for this many seconds is lost
LOST_AFTER = 5.0


class Refusal(Exception):
    """This node cannot take part: one line, the option at fault and what to do."""

    def __init__(self, message: str, *, variable: str | None = None,
                 value: str | None = None, hint: str = "") -> None:
        super().__init__(message)
        self.payload = {"error": message, "variable": variable, "value": value, "hint": hint}


def _endpoint(spec: RdzvSpec) -> str:
    return f"{spec.endpoint_host}:{spec.endpoint_port}"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def open_endpoint(spec: RdzvSpec) -> tuple[Store, bool]:
    """The store at the endpoint (:func:`unirank.store.open_store`), and whether this process
    serves it."""
    from unirank.errors import ConfigError
    from unirank.store import StoreError, open_store

    def opened(serve: bool, hint: str) -> Store:
        store: Store = open_store(spec.endpoint_host, spec.endpoint_port, rank=-1, serve=serve,
                          timeout=float(spec.join_timeout), served_by="the endpoint's node",
                          hint=hint, addr_source="--rdzv-endpoint")
        return store

    if spec.serves_endpoint:
        try:
            store = opened(True, "pick a free port for --rdzv-endpoint")
            store.set(JOB_KEY, spec.run_id)
            return store, True
        except (ConfigError, StoreError):
            pass  # in use: another node of this host serves it (else the client fails too)
    try:
        store = opened(False, "start unirank run on the endpoint's host too (its node serves "
                       "the rendezvous), or give --rdzv-endpoint one of the nodes' addresses")
    except StoreError as exc:
        raise Refusal(exc.what.split(" HINT: ")[0], hint=exc.what.partition(" HINT: ")[2]) \
            from None
    return store, False


def check_job(store: Store, spec: RdzvSpec) -> None:
    """Refuse a node whose ``--rdzv-id`` is not the one the endpoint's node serves."""
    if not store.check([JOB_KEY]):
        return  # served by something else than unirank run (or not yet recorded)
    job = store.get(JOB_KEY).decode()
    if job != spec.run_id:
        raise Refusal(
            f"is not the job the rendezvous at {_endpoint(spec)} serves, {job!r}",
            variable="--rdzv-id", value=spec.run_id,
            hint="give every node of one job the same --rdzv-id, and each job its own "
            "--rdzv-endpoint")


def _claim_key(spec: RdzvSpec, addr: str | None = None) -> str:
    return f"unirank.rdzv.{spec.run_id}.node.{addr or spec.local_addr}"


def claim_node(store: Store, spec: RdzvSpec, *, interval: float = BEAT_INTERVAL) -> str:
    """Claim this node's address in the rendezvous, or refuse when a live helper holds it (a
    node started twice); a claim whose beat stopped (its node died) is taken over. Returns
    the claim's key; a daemon thread beats it from then on."""
    key, beat = _claim_key(spec), _claim_key(spec) + ".beat"
    token = json.dumps({"pid": os.getppid(), "name": spec.node_name, "t": time.time()})
    held = store.compare_set(key, "", token).decode()
    if held != token and (_beats(store, beat, 3 * interval)
                          or store.compare_set(key, held, token).decode() != token):
        raise Refusal(_started_twice(spec, held), variable="--local-addr",
                      value=spec.local_addr,
                      hint="a node joins a job once: end the other unirank run, or give this "
                      "one another --local-addr (or another --rdzv-id for another job)")

    def beat_forever() -> None:
        with contextlib.suppress(RuntimeError):  # the store went with its node: the job ended
            while True:
                store.add(beat, 1)
                time.sleep(interval)

    threading.Thread(target=beat_forever, name="unirank-rdzv-beat", daemon=True).start()
    return key


def _beats(store: Store, beat: str, within: float) -> bool:
    """Whether the claim's holder is alive: its beat advances ``within`` seconds (it beats
    every :data:`BEAT_INTERVAL`), or its store went away meanwhile (its job ended)."""
    try:
        before = store.add(beat, 0)
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            time.sleep(0.05)
            if store.add(beat, 0) != before:
                return True
    except RuntimeError:
        return True
    return False


def _started_twice(spec: RdzvSpec, held: str) -> str:
    try:
        owner = json.loads(held)
        who = f"unirank run pid {owner['pid']} on {owner['name']}"
    except (ValueError, KeyError, TypeError):
        who = "another unirank run"
    return (f"this node already takes part in the rendezvous {spec.run_id!r} at "
            f"{_endpoint(spec)} ({who})")


def make_handler(store: Store, spec: RdzvSpec) -> Any:
    """torch's dynamic rendezvous handler over the c10d backend, with torchrun's settings."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    params = RendezvousParameters(
        backend="c10d", endpoint=_endpoint(spec), run_id=spec.run_id,
        min_nodes=spec.min_nodes, max_nodes=spec.max_nodes, local_addr=spec.local_addr,
        join_timeout=spec.join_timeout, last_call_timeout=spec.last_call_timeout,
        close_timeout=spec.close_timeout, keep_alive_interval=spec.keep_alive_interval,
        keep_alive_max_attempt=spec.keep_alive_max_attempt)
    return create_handler(store, C10dRendezvousBackend(store, spec.run_id), params)


def next_assignment(handler: Any, spec: RdzvSpec, serves: bool,
                    round_: int) -> tuple[Assignment, list[NodeRecord]]:
    """Join the next round, then exchange the nodes' records in the round's store."""
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousClosedError,
        RendezvousTimeoutError,
    )

    try:
        info = handler.next_rendezvous()
    except RendezvousTimeoutError:
        raise Refusal(
            f"the rendezvous {spec.run_id!r} at {_endpoint(spec)} did not complete within "
            f"join_timeout={spec.join_timeout} s (fewer than {spec.min_nodes} nodes joined)",
            hint="start unirank run with the same --rdzv-endpoint and --rdzv-id on the other "
            "nodes, or raise --rdzv-conf join_timeout") from None
    except RendezvousClosedError:
        raise Refusal(f"the rendezvous {spec.run_id!r} at {_endpoint(spec)} is closed (its "
                      "job ended)", variable="--rdzv-id", value=spec.run_id,
                      hint="give the new job its own --rdzv-id") from None
    record = NodeRecord(addr=spec.master_addr() if serves else spec.local_addr,
                        name=spec.node_name, nproc=spec.nproc, store_port=spec.store_port,
                        serves_endpoint=serves, claim=spec.local_addr)
    info.store.set(f"unirank.node.{info.rank}", to_line(record))
    records = [NodeRecord(**json.loads(info.store.get(f"unirank.node.{r}")))
               for r in range(info.world_size)]
    return assign(records, info.rank, round_), records


def watch_world(store: Store, handler: Any, spec: RdzvSpec, peers: list[NodeRecord],
                stop: threading.Event) -> None:
    """Until ``stop``: say (one ``{"event": ...}`` line) when a peer's beat stalls for
    :data:`LOST_AFTER` seconds (lost: killed, or its machine gone or hung) while it still
    holds its claim (a node whose run ended gave it back), or (``admit_joiners``) when a node
    waits to join while the world is below ``max_nodes``. A store that went away is not
    news: its node (node rank 0, where rank 0 runs) ended, and the workers learn it
    themselves."""
    beats = {p.claim: _claim_key(spec, p.claim) + ".beat" for p in peers}
    names = {p.claim: p.name for p in peers}
    try:
        last = {claim: (store.add(key, 0), time.monotonic()) for claim, key in beats.items()}
        while not stop.wait(BEAT_INTERVAL):
            now = time.monotonic()
            for claim, key in list(beats.items()):
                value = store.add(key, 0)
                if value != last[claim][0]:
                    last[claim] = (value, now)
                elif not store.check([_claim_key(spec, claim)]):
                    del beats[claim]  # it left: its run ended (it gave its claim back)
                elif now - last[claim][1] >= LOST_AFTER:
                    _answer({"event": f"node {names[claim]} ({claim}) is lost: no beat for "
                                      f"{now - last[claim][1]:.0f} s"})
                    return
            if spec.admit_joiners and len(peers) + 1 < spec.max_nodes \
                    and handler.num_nodes_waiting() > 0:
                _answer({"event": f"{handler.num_nodes_waiting()} node(s) wait to join"})
                return
    except RuntimeError:
        return  # the store's node ended


def _answer(payload: object) -> None:
    os.write(1, to_line(payload))


def _serve(spec: RdzvSpec) -> None:
    store, serves = open_endpoint(spec)
    check_job(store, spec)
    key = claim_node(store, spec)
    handler = make_handler(store, spec)
    round_ = 0
    try:
        while True:
            assignment, records = next_assignment(handler, spec, serves, round_)
            _answer(assignment)
            stop = threading.Event()
            peers = [r for r in records if r.claim != spec.local_addr]
            watcher = threading.Thread(target=watch_world, args=(store, handler, spec, peers,
                                                                 stop),
                                       name="unirank-rdzv-watch", daemon=True)
            watcher.start()
            line = sys.stdin.buffer.readline().strip()
            stop.set()
            watcher.join(timeout=2 * BEAT_INTERVAL + 1)
            if line != b"next":
                return
            round_ += 1
    finally:
        with contextlib.suppress(RuntimeError):  # the store may have gone with its node
            store.delete_key(key)  # this node may join again at once


def main() -> NoReturn:
    """The helper's entry: one spec in, assignments out, until stdin ends."""
    from unirank.supervisor.worker.pdeathsig import set_parent_death_signal

    set_parent_death_signal()
    code = 0
    try:
        spec = RdzvSpec(**json.loads(sys.stdin.buffer.readline()))
        _serve(spec)
    except Refusal as refusal:
        _answer(refusal.payload)
        code = 2
    except Exception as exc:  # torch's errors, said in one line
        _answer({"error": f"the rendezvous failed: {type(exc).__name__}: {_first_line(exc)}"})
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # torch's threads and the store it may serve end with it


if __name__ == "__main__":
    main()
