"""The one route rule (:mod:`unirank.netroute`): which interface this host uses to reach an
address, IPv4 and IPv6. The pure parts take text and mappings; the rest asks this host's kernel
about its loopback (always routed through ``lo``) and compares the interface list with psutil's
where psutil is installed (a Horovod dependency)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from unirank import netroute

IF_INET6 = (
    "fd000000000000000000000000000002 04 40 00 82     eth0\n"
    "00000000000000000000000000000001 01 80 10 80       lo\n"
    "fe8000000000000000fc00fffe000001 04 40 20 80     eth0\n"
    "not a line\n"
)


def _has_ipv6_loopback() -> bool:
    return socket.has_ipv6 and "::1" in netroute.interfaces().get("lo", ())


def test_if_inet6_lines_become_interface_and_address() -> None:
    assert netroute.parse_if_inet6(IF_INET6) == [
        ("eth0", "fd00::2"), ("lo", "::1"), ("eth0", "fe80::fc:ff:fe00:1")]


def test_the_interface_file_adds_ipv6_addresses_after_ipv4_ones(tmp_path: Path) -> None:
    path = tmp_path / "if_inet6"
    path.write_text("00000000000000000000000000000001 01 80 10 80       lo\n")
    lo = netroute.interfaces(str(path))["lo"]
    assert lo[-1] == "::1"
    assert "127.0.0.1" in lo[:-1]


@pytest.mark.parametrize(
    ("address", "expected"),
    [("10.0.0.5", "eth0"), ("fd00::5", "eth0"), ("fe80::5%eth0", "eth0"), ("::1", "lo"),
     ("172.17.0.1", "docker0"), ("10.9.9.9", None), (None, None), ("", None)],
)
def test_holder_names_the_interface_holding_an_address(address: str | None,
                                                       expected: str | None) -> None:
    ifaces = {"lo": ("127.0.0.1", "::1"), "eth0": ("10.0.0.5", "fd00::5", "fe80::5%eth0"),
              "docker0": ("172.17.0.1",), "ib0": ()}
    assert netroute.holder(address, ifaces) == expected


def test_ipv4_loopback_routes_through_lo() -> None:
    assert netroute.route_source("127.0.0.1") == "127.0.0.1"
    assert netroute.interface_towards("127.0.0.1") == "lo"


def test_ipv6_loopback_routes_through_lo() -> None:
    if not _has_ipv6_loopback():
        pytest.skip("this host has no IPv6 loopback")
    assert netroute.route_source("::1") == "::1"
    assert netroute.interface_towards("::1") == "lo"


def test_an_address_of_this_host_routes_through_its_interface() -> None:
    for name, addresses in netroute.interfaces().items():
        for address in addresses:
            if not address.startswith(("127.", "::1", "fe80:")):
                assert netroute.interface_towards(address) in (name, "lo"), (name, address)


def test_no_route_is_none() -> None:
    # the broadcast address: a UDP socket without SO_BROADCAST may not be connected to it
    assert netroute.route_source("255.255.255.255") is None
    assert netroute.interface_towards("255.255.255.255") is None


def test_interfaces_list_every_address_psutil_lists() -> None:
    psutil = pytest.importorskip("psutil")
    found = netroute.interfaces()
    for name, entries in psutil.net_if_addrs().items():
        for entry in entries:
            if entry.family in (socket.AF_INET, socket.AF_INET6):
                base = name.partition(":")[0]
                assert entry.address.split("%")[0] in found[base], (name, entry.address, found)
