"""The network-namespace helper (tests/integration/_netns.py): two nodes reach each other over
TCP, not while one is cut off, again once healed; the namespaces are gone afterwards and two
nets never share a name. Root only (skips elsewhere, fails with ``CI=true``)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from _procs import read_lines

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _netns import Net, address, require

pytestmark = pytest.mark.integration

#: listens on node 1's address, says its port, accepts and closes connections until killed
SERVER = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(8)
print(s.getsockname()[1], flush=True)
while True:
    s.accept()[0].close()
"""
#: exits 0 when a connection to argv[1]:argv[2] is made within 2 s, 1 otherwise
CLIENT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()
except OSError as e:
    print(type(e).__name__, e); sys.exit(1)
"""


@pytest.fixture
def net() -> Iterator[Net]:
    require()
    with Net(2) as made:
        yield made


def _connects(net: Net, port: int) -> bool:
    done = net.run(2, [sys.executable, "-c", CLIENT, address(1), str(port)], timeout=30)
    return done.returncode == 0


def test_a_cut_node_is_unreachable_until_healed(net: Net) -> None:
    server = net.popen(1, [sys.executable, "-c", SERVER, address(1)], stdout=subprocess.PIPE,
                       stdin=subprocess.DEVNULL)
    assert server.stdout is not None
    port = int(read_lines(server.stdout, 1, timeout=30)[0])
    assert _connects(net, port)
    net.cut(1)
    assert not _connects(net, port)
    net.heal(1)
    assert _connects(net, port)
    assert net.pids(1) == [server.pid]
    assert net.close() == [server.pid]  # killed by close: it never ends by itself
    assert server.wait(timeout=30) < 0
    server.stdout.close()


def test_namespaces_are_unique_and_deleted(net: Net) -> None:
    with Net(1) as other:
        assert not set(other.names.values()) & set(net.names.values())
        assert other.switch != net.switch
        made = [*other.names.values(), other.switch]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                            timeout=30).stdout
    assert not {line.split()[0] for line in listed.splitlines()} & set(made)
