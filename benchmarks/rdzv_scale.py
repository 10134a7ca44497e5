"""The rendezvous at scale: ``python3 benchmarks/rdzv_scale.py [--nodes 256 1024 4096]``.

For each node count N, the real rendezvous server (:class:`unirank.supervisor.rdzv.server.
Server`, in a process of its own, as in a node's helper) serves N lightweight simulated nodes
(this process: each a real connection speaking the real protocol, hello, join, a beat each
second, a join again when told a node was lost). It prints, per N: the time until every node
had round 0; the time from one node's loss (its connection closed: proven dead) until every
other node had round 1, and the bytes every node received for that round; the server's CPU
share over 5 s of steady beats; then the serving node's loss (its process killed): the time
until a successor (the real server resumed from round 1, as the helper of the round's first
node starts it) serves and every node has round 2 from it. No torch; loopback only.

The simulated nodes play the helpers' part of a successor's takeover: each goes to the
successor's port once its connection ended (a real helper first finds the old address
refusing, which on loopback takes well under a millisecond). Not covered: a real job beside
the simulated nodes in one rendezvous (a member must hold at least one rank, and a simulated
member's rank would hold the real job's world; as waiting nodes they would join at its next
round). Environment variables read: none.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from unirank.supervisor.rdzv.change import read_round  # noqa: E402
from unirank.supervisor.rdzv.spec import to_line  # noqa: E402

#: a simulated node's record (its names added)
RECORD = {"addr": "127.0.0.1", "nproc": 1, "store_port": 1, "serves_endpoint": False,
          "rdzv_port": 1}

SERVER = """
import json, sys, threading
from unirank.supervisor.listen import open_store_socket
from unirank.supervisor.rdzv.server import Server
from unirank.supervisor.rdzv.spec import RdzvSpec
nodes = int(sys.argv[1])
listening = open_store_socket(0)
spec = RdzvSpec(endpoint_host="127.0.0.1", endpoint_port=listening.getsockname()[1],
                run_id="scale", min_nodes=1, max_nodes=nodes, local_addr="127.0.0.1",
                node_name="server", nproc=1, serves_endpoint=True)
Server([listening], spec, "server-node").start()
print(spec.endpoint_port, flush=True)
sys.stdin.read()
"""

#: the successor: its socket listens from the start (as a helper's spare socket does); it
#: serves from the moment it reads the last round on stdin
SUCCESSOR = """
import json, sys
from unirank.supervisor.listen import open_store_socket
from unirank.supervisor.rdzv.server import Resume, Server
from unirank.supervisor.rdzv.spec import RdzvSpec
nodes = int(sys.argv[1])
listening = open_store_socket(0)
print(listening.getsockname()[1], flush=True)
last = json.loads(sys.stdin.readline())
spec = RdzvSpec(endpoint_host="127.0.0.1", endpoint_port=int(sys.argv[2]),
                run_id="scale", min_nodes=1, max_nodes=nodes, local_addr="127.0.0.1",
                node_name="server", nproc=1, serves_endpoint=True)
gone = frozenset(["server-node"])
Server([listening], spec, last["members"][0], Resume(last["round"], tuple(last["members"]),
       last["records"], gone, gone)).start()
sys.stdin.read()
"""


class Nodes:
    """N simulated nodes on one selector."""

    def __init__(self, port: int, count: int) -> None:
        self.selector = selectors.DefaultSelector()
        self.socks: dict[int, socket.socket] = {}
        self.buffers: dict[int, bytes] = {}
        self.rounds: dict[int, int] = {}
        self.received: dict[int, int] = {}
        #: node 1's view of the rounds (it decodes them all): what a successor resumes from
        self.view: tuple[int, tuple[str, ...], dict[str, dict[str, Any]]] = (-1, (), {})
        #: where the nodes go once their server's connection ends (None: they are lost)
        self.successor: int | None = None
        for index in range(count):
            self.received[index] = 0
            self.connect(index, port, -1)

    def connect(self, index: int, port: int, known: int) -> None:
        """Node ``index`` says hello to the server at ``port`` and joins."""
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.setblocking(False)
        self.socks[index] = sock
        self.buffers[index] = b""
        self.selector.register(sock, selectors.EVENT_READ, index)
        self._send(index, {"op": "hello", "job": "scale", "node": f"sim{index}",
                           "name": f"sim{index}", "pid": index, "round": known,
                           "known": known, "token": f"t{index}"})
        self._send(index, {"op": "join", "record": RECORD | {"name": f"sim{index}",
                                                             "claim": f"sim{index}"}})

    def _send(self, index: int, payload: object) -> None:
        """Send without blocking (one process plays every node: it must go on reading); a
        message the kernel cannot take now is dropped, as a beat lost on the way."""
        with contextlib.suppress(BlockingIOError):
            self.socks[index].send(to_line(payload))

    beat_at = 0.0

    def beat(self) -> None:
        self.beat_at = time.monotonic()
        for index in self.socks:
            self._send(index, {"op": "beat"})

    def pump(self, until: float) -> None:
        """Read and answer until ``until`` (monotonic) or until every node has the round
        :attr:`want`."""
        while time.monotonic() < until:
            if time.monotonic() - self.beat_at >= 1.0:  # every node beats each second
                self.beat()
            for key, _ in self.selector.select(0.05):
                self._read(int(key.data))
            if all(r >= self.want for i, r in self.rounds.items() if i in self.socks) and \
                    len(self.rounds) >= len(self.socks):
                return

    want = 0
    dropped = 0

    def _read(self, index: int) -> None:
        try:
            chunk = self.socks[index].recv(1 << 20)
        except BlockingIOError:
            return
        except ConnectionResetError:
            chunk = b""
        if not chunk:  # the server ended (a successor serves) or dropped this node
            self.lose(index)
            if self.successor is None:
                self.dropped += 1
            else:
                self.connect(index, self.successor, self.view[0])
            return
        self.received[index] = self.received.get(index, 0) + len(chunk)
        self.buffers[index] += chunk
        while b"\n" in self.buffers[index]:
            line, _, self.buffers[index] = self.buffers[index].partition(b"\n")
            message = json.loads(line) if index == 1 else _decoded(line)
            if "round" in message and ("members" in message or "after" in message):
                self.rounds[index] = int(message["round"])  # whole, or as a change
                if index == 1:
                    _, members, records = self.view
                    self.view = (int(message["round"]),
                                 *read_round(message, self.view[0], members, records))
            elif message.get("kind") == "lost":
                self._send(index, {"op": "join", "record": {
                    "addr": "127.0.0.1", "name": f"sim{index}", "nproc": 1, "store_port": 1,
                    "serves_endpoint": False, "claim": f"sim{index}", "rdzv_port": 1}})

    def lose(self, index: int) -> None:
        sock = self.socks.pop(index)
        self.selector.unregister(sock)
        sock.close()
        self.rounds.pop(index, None)


def _decoded(line: bytes) -> dict[str, Any]:
    """A message; of a whole round (every member's record: 800 KB at 4,096 nodes, which one
    process playing every node could not decode in time) only its number (keys are sorted:
    it comes after the records, which hold no key of that name)."""
    if len(line) > 4096:
        at = line.rindex(b'"round": ') + 9
        return {"round": int(line[at:line.index(b",", at)]), "members": None}
    return dict(json.loads(line))


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


def measure(count: int) -> dict[str, float]:
    server, successor = _python(SERVER, str(count)), _python(SUCCESSOR, str(count), "0")
    try:
        assert server.stdout is not None and successor.stdout is not None
        assert successor.stdin is not None
        port, spare = int(server.stdout.readline()), int(successor.stdout.readline())
        began = time.monotonic()
        nodes = Nodes(port, count)
        nodes.want = 0
        nodes.pump(began + 300)
        joined = time.monotonic() - began
        before = dict(nodes.received)
        lost_at = time.monotonic()
        nodes.lose(0)
        nodes.want = 1
        nodes.pump(lost_at + 300)
        recovered = time.monotonic() - lost_at
        sent = sum(nodes.received[i] - before[i] for i in nodes.socks)
        cpu0, wall0 = _cpu(server.pid), time.monotonic()
        nodes.want = 2  # none comes: five seconds of beats
        nodes.pump(time.monotonic() + 5.0)
        share = (_cpu(server.pid) - cpu0) / (time.monotonic() - wall0)
        number, members, records = nodes.view
        moved_at = time.monotonic()
        successor.stdin.write(json.dumps({"round": number, "members": members,
                                          "records": records}) + "\n")
        successor.stdin.flush()
        nodes.successor = spare
        server.kill()
        nodes.pump(moved_at + 300)
        moved = time.monotonic() - moved_at
        return {"nodes": count, "dropped": nodes.dropped, "join_s": joined,
                "loss_to_round_s": recovered, "round_bytes": sent,
                "round_bytes_per_node": sent / max(1, count - 1),
                "server_cpu_share": share, "server_loss_to_round_s": moved,
                "all_moved": float(min(nodes.rounds.values()) == 2)}
    finally:
        for process in (server, successor):
            process.kill()
            process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[256, 1024, 4096])
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 3 * max(args.nodes) + 64)),
                                                hard))
    for count in args.nodes:
        row = measure(count)
        print(f"{count:5d} nodes: all in round 0 after {row['join_s']:.2f} s; a node lost -> "
              f"round 1 at every node after {row['loss_to_round_s']:.2f} s; that round: "
              f"{row['round_bytes'] / 1e6:.1f} MB in all, {row['round_bytes_per_node']:.0f} B "
              f"a node; server CPU at steady beats {100 * row['server_cpu_share']:.0f} % of a "
              f"core; the serving node lost -> a successor serving and round 2 at every "
              f"node after {row['server_loss_to_round_s']:.2f} s; nodes dropped by the "
              f"server: {row['dropped']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
