"""Bad input for a running rendezvous (the fuzz test of ``tests/cli/test_rdzv_fuzz.py``): what a
process that knows only the endpoint and the default id can send. Seeded; loopback only.

:func:`inputs` draws the inputs (each one a connection's bytes and what to do after them);
:func:`throw` sends them, one connection each, and returns how many of each kind it sent.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Input", "inputs", "throw"]


@dataclass(frozen=True)
class Input:
    """One connection's worth of bad input: its ``kind``, the bytes sent, whether the
    connection is then left open (``half_open``: held until the end) and whether the bytes
    go one at a time (``slow``)."""

    kind: str
    data: bytes
    half_open: bool = False
    slow: bool = False


def _line(payload: object) -> bytes:
    return json.dumps(payload).encode() + b"\n"


def _hello(node: str, job: str = "none", **extra: object) -> bytes:
    return _line({"op": "hello", "job": job, "node": node, "name": "fuzz", "pid": 1, **extra})


def _one(rng: random.Random, index: int, members: list[str]) -> Input:
    """Input number ``index``: the kinds in turn, each drawn afresh."""
    node = f"fuzz:{index}:{rng.getrandbits(32):08x}"
    kinds = [
        ("garbage", lambda: bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300)))
         .replace(b"\n", b"") + b"\n"),
        ("not-an-object", lambda: _line(rng.choice([[1, 2], "hello", 3, None, True]))),
        ("truncated", lambda: _hello(node)[:rng.randint(1, 40)]),
        ("bad-types", lambda: _line({"op": "hello", "job": rng.choice([1, [], None, {}]),
                                     "node": rng.choice([None, 5, ["x"]]), "pid": "x"})),
        ("bad-pid", lambda: _hello(node, pid=rng.choice(["x", 1.5, [], {"a": 1}]))),
        ("out-of-order", lambda: _line({"op": rng.choice(["join", "beat", "leave", "abandon",
                                                          "evict"]),
                                        "nodes": members, "record": {"addr": "x"}})),
        ("unknown-op", lambda: _line({"op": rng.choice(["teleport", "", "HELLO", 7])})),
        ("wrong-job", lambda: _hello(node, job=rng.choice(["other", "", "x" * 100]))),
        ("evict", lambda: _hello(node) + _line({"op": "evict", "nodes": members or ["a"],
                                                "why": "fuzz"})),
        ("redirect", lambda: _line({"op": "redirect", "job": "none", "round": 99,
                                    "server": rng.choice(members or ["x"]), "place": 0,
                                    "addr": "192.0.2.1", "port": 9, "name": "fuzz"})),
        ("impersonate", lambda: _hello(rng.choice(members or ["x"]), round=99)),
        ("bad-join", lambda: _hello(node) + _line({"op": "join", "record": {
            "addr": 7, "name": "x", "nproc": "2", "store_port": 0, "serves_endpoint": 0}})),
        ("huge-field", lambda: _hello("n" * 5000)),
    ]
    kind, make = kinds[index % len(kinds)]
    if index % 997 == 0:
        return Input("oversized", b"x" * (2 << 20))
    if index % 499 == 0:
        return Input("slow", _hello(node)[:30], slow=True)
    return Input(kind, make(), half_open=index % 50 == 0)


def inputs(count: int, seed: int, members: list[str]) -> Iterator[Input]:
    """``count`` inputs drawn from ``seed``; ``members``: node identities of the job (a hello's
    answer gives them to anyone: impersonations and evictions name them)."""
    rng = random.Random(seed)
    for index in range(count):
        yield _one(rng, index, members)


def members_of(host: str, port: int) -> list[str]:
    """The job's node identities, as any hello's answer gives them."""
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(_hello("fuzz:probe"))
        data = b""
        while b"\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return []
            data += chunk
    answer = json.loads(data.split(b"\n", 1)[0])
    return [str(m) for m in answer.get("members") or []]


def throw(host: str, port: int, count: int, seed: int) -> Counter[str]:
    """Send ``count`` inputs to the rendezvous at ``host:port``, one connection each; the
    number sent of each kind."""
    members = members_of(host, port)
    sent: Counter[str] = Counter()
    held: list[socket.socket] = []
    try:
        for item in inputs(count, seed, members):
            sock = socket.create_connection((host, port), timeout=10)
            with contextlib.suppress(OSError):
                if item.slow:
                    for byte in item.data:
                        sock.sendall(bytes([byte]))
                else:
                    sock.sendall(item.data)
            sent[item.kind] += 1
            if item.half_open:
                held.append(sock)
            else:
                sock.close()
    finally:
        for sock in held:
            sock.close()
    return sent
