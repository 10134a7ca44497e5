"""The host list of ``unirank run --hosts/--hostfile`` (pure): forms, filters, slot counts, and
the one-line refusals.

The hostfile golden test reads ``tests/fixtures/hostfiles/<name>.txt`` and compares with
``<name>.json``; regenerate after a deliberate change with ``UNIRANK_REGEN_GOLDEN=1`` and
review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from unirank.errors import ConfigError
from unirank.supervisor.ssh.hosts import (
    Host,
    common_slots,
    parse_hostfile,
    parse_hosts,
    select_hosts,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hostfiles"


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.txt")), ids=lambda p: p.stem)
def test_hostfile_matches_its_golden_file(path: Path) -> None:
    hosts = [[h.name, h.slots] for h in parse_hostfile(path.read_text(), path.name)]
    golden = path.with_suffix(".json")
    if os.environ.get("UNIRANK_REGEN_GOLDEN") == "1":
        golden.write_text(json.dumps(hosts) + "\n")
    assert hosts == json.loads(golden.read_text())


def test_hosts_option_keeps_order_and_slots() -> None:
    assert parse_hosts("node1:4, node2:4,node3") == [
        Host("node1", 4), Host("node2", 4), Host("node3", None)]
    assert parse_hosts("[::1]:2,user@gpu-a,[fe80::1]") == [
        Host("::1", 2), Host("user@gpu-a", None), Host("fe80::1", None)]


@pytest.mark.parametrize(("text", "says"), [
    ("node1:0", "slot count that is not a positive integer: '0'"),
    ("node1:x", "slot count that is not a positive integer: 'x'"),
    ("node1,node1:2", "names node1 twice"),
    (",", "names no host"),
    ("-oProxyCommand=x", "is not a host name"),
    ("a b", "is not a host name"),
])
def test_bad_hosts_are_refused_in_one_line(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match="HINT") as caught:
        parse_hosts(text)
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("text", "says"), [
    ("node1 slots=4\nnode2 cpus=4\n", "hosts:2='node2 cpus=4': has 'cpus=4'"),
    ("node1:4 slots=4\n", "gives the slots twice"),
    ("# only a comment\n\n", "names no host"),
    ("node1 slots=-1\n", "not a positive integer"),
])
def test_bad_hostfile_lines_are_named_by_line(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_hostfile(text, "hosts")
    assert says in str(caught.value)


def test_include_and_exclude_take_deepspeeds_at_separated_names() -> None:
    hosts = parse_hosts("a:2,b:2,c:2")
    assert select_hosts(hosts, "c@a", None) == [Host("a", 2), Host("c", 2)]
    assert select_hosts(hosts, None, "b") == [Host("a", 2), Host("c", 2)]
    assert select_hosts(hosts, None, None) == hosts


@pytest.mark.parametrize(("include", "exclude", "says"), [
    ("d", None, "names d, which is not in the host list"),
    ("a:0,1", None, "selects slots; unirank selects whole hosts"),
    (None, "a@b@c", "leaves no host"),
    ("a", "b", "cannot be combined with --exclude"),
])
def test_bad_filters_are_refused(include: str | None, exclude: str | None, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        select_hosts(parse_hosts("a:2,b:2,c:2"), include, exclude)
    assert says in str(caught.value)


def test_every_host_gets_the_same_slots_or_none_says() -> None:
    assert common_slots(parse_hosts("a:2,b:2")) == 2
    assert common_slots(parse_hosts("a,b")) is None
    with pytest.raises(ConfigError, match="a:2,b:4.*different slot counts"):
        common_slots(parse_hosts("a:2,b:4"))
    with pytest.raises(ConfigError, match=r"a:2,b:\?"):
        common_slots(parse_hosts("a:2,b"))
