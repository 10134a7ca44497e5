"""Nodes in network namespaces of their own, joined by a bridge whose ports can be cut (root only).

:class:`Net` makes, for ``N`` nodes, one namespace per node and one more holding the bridge
(``br0``); node ``n`` (1-based) reaches the bridge through a veth pair (``eth0`` in the node's
namespace, port ``p<n>`` on the bridge) and has the address ``10.77.0.<n>/24``
(:func:`address`), given inside its own namespace only: nothing is routed outside, no packet
leaves the namespaces. :meth:`Net.cut` takes a node's bridge port down (a partition: its
connections and connects time out) and :meth:`Net.heal` brings it up again. :meth:`Net.prefix`
is the command prefix that runs a command in a node's namespace (``ip netns exec``).

The namespaces' names start with the pid of the process that made them and a counter, so that
parallel pytest workers (and two nets of one test) never collide. :meth:`Net.close` (also the
context manager's exit) kills whatever still runs in them, deletes them all, and returns the
pids it had to kill, for a test to assert that none was left.

:func:`require` is the skip-unless-root: a missing lane (not root, no ``ip``, namespaces that
cannot be made) skips elsewhere and fails with ``CI=true`` (:func:`_procs.unavailable`).

The kernel here has no ``netem`` (no added delay; field facts); a link's bandwidth could be
bounded with ``tbf``, which this helper does not do.

Environment variables read: ``CI`` (through :func:`_procs.unavailable`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from _procs import unavailable, wait_gone

#: the nodes' network (RFC 1918, but only ever inside the namespaces this module makes)
SUBNET = "10.77.0"
#: a node's interface in its namespace (its end of the veth pair): where gloo's pairs go
#: (``GLOO_SOCKET_IFNAME``), the host's name resolving to none of the nodes' addresses
IFNAME = "eth0"
#: how long one ``ip`` command may take
IP_TIMEOUT = 30.0
_COUNTER = itertools.count()


def address(node: int) -> str:
    """Node ``node``'s address (nodes are numbered from 1)."""
    return f"{SUBNET}.{node}"


def require() -> None:
    """Skip (fail with ``CI=true``) unless network namespaces can be made here: root and
    ``ip``."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        unavailable("nodes in network namespaces need root and ip (iproute2)")


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class Net:
    """``nodes`` nodes on one bridge (see the module docstring). Use as a context manager, or
    call :meth:`close`."""

    def __init__(self, nodes: int) -> None:
        if nodes < 1 or nodes > 250:
            raise ValueError(f"nodes must be 1..250, not {nodes}")
        tag = f"ur{os.getpid()}x{next(_COUNTER)}"
        self.switch = f"{tag}sw"
        self.names = {n: f"{tag}n{n}" for n in range(1, nodes + 1)}
        self._made: list[str] = []
        try:
            self._build()
        except (RuntimeError, subprocess.TimeoutExpired) as failed:
            self.close()
            unavailable("network namespaces cannot be made here", str(failed))

    def _build(self) -> None:
        for name in (self.switch, *self.names.values()):
            _ip("netns", "add", name)
            self._made.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for node, name in self.names.items():
            _ip("-n", self.switch, "link", "add", f"p{node}", "type", "veth", "peer", "name",
                IFNAME, "netns", name)
            _ip("-n", self.switch, "link", "set", f"p{node}", "master", "br0", "up")
            _ip("-n", name, "addr", "add", f"{address(node)}/24", "dev", IFNAME)
            _ip("-n", name, "link", "set", IFNAME, "up")

    @property
    def nodes(self) -> list[int]:
        return list(self.names)

    def prefix(self, node: int) -> list[str]:
        """The command prefix that runs a command in node ``node``'s namespace."""
        return ["ip", "netns", "exec", self.names[node]]

    def run(self, node: int, argv: Sequence[str], *, timeout: float,
            env: Mapping[str, str] | None = None,
            **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` to its end in node ``node``'s namespace (output captured as text)."""
        return subprocess.run([*self.prefix(node), *argv], capture_output=True, text=True,
                              timeout=timeout, env=env, **kwargs)

    def popen(self, node: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` in node ``node``'s namespace (``kwargs`` go to Popen)."""
        return subprocess.Popen([*self.prefix(node), *argv], **kwargs)

    def cut(self, node: int) -> None:
        """Cut node ``node`` off the others (its bridge port down)."""
        _ip("-n", self.switch, "link", "set", f"p{node}", "down")

    def heal(self, node: int) -> None:
        """Join node ``node`` to the others again (its bridge port up)."""
        _ip("-n", self.switch, "link", "set", f"p{node}", "up")

    def pids(self, node: int | None = None) -> list[int]:
        """The processes in node ``node``'s namespace (every node's when ``None``)."""
        names = [self.names[node]] if node is not None else list(self.names.values())
        found: list[int] = []
        for name in names:
            if name not in self._made:
                continue
            done = subprocess.run(["ip", "netns", "pids", name], capture_output=True,
                                  text=True, timeout=IP_TIMEOUT)
            found.extend(int(p) for p in done.stdout.split())
        return found

    def close(self) -> list[int]:
        """Kill what still runs in the namespaces, delete them; the pids it had to kill."""
        left = self.pids()
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_gone(left)
        for name in reversed(self._made):
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                _ip("netns", "del", name)
        self._made.clear()
        return left

    def __enter__(self) -> Net:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
