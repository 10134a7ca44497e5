"""The store socket node 0's supervisor opens before its workers start (real sockets)."""

from __future__ import annotations

import socket

import pytest

from unirank.errors import ConfigError
from unirank.supervisor.listen import open_store_socket, store_family


def test_family_follows_the_master_address() -> None:
    assert store_family("127.0.0.1") == socket.AF_INET
    assert store_family("10.1.2.3") == socket.AF_INET
    assert store_family("::1") == socket.AF_INET6
    assert store_family("localhost") in (socket.AF_INET, socket.AF_INET6)


def test_free_port_accepts_connections_before_anyone_accepts() -> None:
    with open_store_socket(0, host="127.0.0.1") as sock:
        assert sock.family == socket.AF_INET
        assert not sock.getblocking()
        port = sock.getsockname()[1]
        assert port > 0
        # the kernel completes the handshake: a client does not need the server to be running
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass


def test_port_in_use_is_a_one_line_config_error() -> None:
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError) as info:
            open_store_socket(port, host="127.0.0.1", option="MASTER_PORT")
    text = str(info.value)
    assert text.startswith(f"MASTER_PORT='{port}': is already in use on this host")
    assert "--master-port" in text and "\n" not in text
