"""Which node's link is slow, by its beats' round trips (unirank.supervisor.rdzv.linkrule):
pure (the server's echo: tests/supervisor/test_rdzv_change.py)."""

from __future__ import annotations

from unirank.supervisor.rdzv.linkrule import FACTOR, FLOOR_US, odd_link


def test_the_node_whose_beats_wait_behind_its_traffic_is_named() -> None:
    # measured in network namespaces: 3 ms against 0.1-0.2 ms with a 200 Mbit/s tbf on one
    assert odd_link({"a": 40, "b": 150, "c": 1250}, "a") == ("c", 1250, 150)
    assert odd_link({"a": 150, "b": 200, "c": 190, "d": 5000}, "a") == ("d", 5000, 200)


def test_every_other_node_slow_alike_names_nobody_as_a_busy_host_would() -> None:
    """The server's own connection never leaves its host: it is not compared (all CPUs busy,
    the other nodes' round trips rose alike: 0.5 ms against 0.04, pinned to one core)."""
    assert odd_link({"a": 40, "b": 2000, "c": 2400}, "a") is None
    assert odd_link({"a": 40, "b": 460, "c": 630}, "a") is None


def test_jitter_a_loaded_host_and_two_nodes_name_nobody() -> None:
    assert odd_link({"a": 50, "b": 900, "c": 100}, "a") is None  # under the floor
    assert odd_link({"a": 2000, "b": 3000, "c": 2500}, "a") is None  # all alike: a busy host
    assert odd_link({"a": 100, "b": 5000}, "a") is None  # two nodes: either end's link


def test_the_bound_is_the_factor_and_the_floor() -> None:
    base = 400
    slow = int(FACTOR * base)
    assert slow >= FLOOR_US
    assert odd_link({"a": base, "b": base, "c": slow}, "a") is not None
    assert odd_link({"a": base, "b": base, "c": slow - 1}, "a") is None


def test_the_kernel_says_a_connection_s_round_trip() -> None:
    import socket

    from unirank.supervisor.rdzv.linkrule import tcp_rtt_us

    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        client.sendall(b"x")
        assert peer.recv(1) == b"x"
        rtt = tcp_rtt_us(client)
        assert rtt is not None and 0 < rtt < 1_000_000
        client.close()
        assert tcp_rtt_us(client) is None  # closed
        peer.close()
