"""Tests for unirank.hostlist: Slurm hostlist expansion and compression.

The table cases include the examples of Slurm's documentation, and
``test_matches_scontrol_show_hostnames`` checks ``expand`` against the real
``scontrol show hostnames`` on the Slurm testbed.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unirank.errors import ConfigError
from unirank.hostlist import (
    MAX_HOSTS,
    compress,
    compress_tasks_per_node,
    count,
    expand,
    expand_tasks_per_node,
    first_host,
)

# --------------------------------------------------------------------------------------------
# expand


EXPAND_CASES = [
    # Slurm's documented examples
    ("tux[0-3,5]", ["tux0", "tux1", "tux2", "tux3", "tux5"]),
    ("linux[00-02]", ["linux00", "linux01", "linux02"]),
    (
        "rack[1-2]-node[01-03]",
        [
            "rack1-node01",
            "rack1-node02",
            "rack1-node03",
            "rack2-node01",
            "rack2-node02",
            "rack2-node03",
        ],
    ),
    # plain names and ranges
    ("node7", ["node7"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("node[001-010]", [f"node{i:03d}" for i in range(1, 11)]),
    ("n[1,3,5-6]", ["n1", "n3", "n5", "n6"]),
    ("a1,b[2-3],c", ["a1", "b2", "b3", "c"]),
    ("n[0-0]", ["n0"]),
    ("n[007]", ["n007"]),
    ("[1-2]", ["1", "2"]),
    # padding: the width of a range is that of its first bound
    ("node[08-11]", ["node08", "node09", "node10", "node11"]),
    ("n[9-11]", ["n9", "n10", "n11"]),
    ("n[8-09]", ["n8", "n9"]),
    ("n[1-010]", [f"n{i}" for i in range(1, 11)]),
    ("n[099-101]", ["n099", "n100", "n101"]),
    ("n[1-3,05-06]", ["n1", "n2", "n3", "n05", "n06"]),
    ("n[01,2,003]", ["n01", "n2", "n003"]),
    # hyphens, dots, digits in prefixes
    ("gpu-a100-01.cluster.org", ["gpu-a100-01.cluster.org"]),
    ("c1001a-s[11,17],c1002a-s5", ["c1001a-s11", "c1001a-s17", "c1002a-s5"]),
    ("x-[1-2]", ["x-1", "x-2"]),
    ("n1[1-2]", ["n11", "n12"]),
    ("a.b[1-2].c[3-4]", ["a.b1.c3", "a.b1.c4", "a.b2.c3", "a.b2.c4"]),
    ("n[1-2][3-4]", ["n13", "n14", "n23", "n24"]),
    # three or more groups: Slurm loops the last innermost, the others right to left
    (
        "a[1-2]b[3-4]c[5-6]",
        ["a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6", "a1b4c5", "a1b4c6", "a2b4c5", "a2b4c6"],
    ),
    (
        "a[1-2]b[3-4]c[5-6]d[7-8]",
        [f"a{a}b{b}c{c}d{d}" for c in (5, 6) for b in (3, 4) for a in (1, 2) for d in (7, 8)],
    ),
    (
        "r[1-2].[0,5]-n[01-02]x",
        [f"r{r}.{m}-n0{n}x" for m in (0, 5) for r in (1, 2) for n in (1, 2)],
    ),
    # text after the last bracket: Slurm rejects it, unirank accepts it
    ("a[1-2]b", ["a1b", "a2b"]),
    ("n[1-2]x[3]y", ["n1x3y", "n2x3y"]),
    # order and duplicates kept
    ("n[3,1,1]", ["n3", "n1", "n1"]),
    ("b,a,a", ["b", "a", "a"]),
    ("n[1-3,2]", ["n1", "n2", "n3", "n2"]),
    ("n[1-3],n2", ["n1", "n2", "n3", "n2"]),
]


@pytest.mark.parametrize(("text", "hosts"), EXPAND_CASES)
def test_expand(text: str, hosts: list[str]) -> None:
    assert expand(text) == hosts


@pytest.mark.parametrize(("text", "hosts"), EXPAND_CASES)
def test_first_host_and_count_agree_with_expand(text: str, hosts: list[str]) -> None:
    assert first_host(text) == hosts[0]
    assert count(text) == len(hosts)


def test_expand_up_to_the_limit() -> None:
    hosts = expand(f"n[1-{MAX_HOSTS}]")
    assert len(hosts) == MAX_HOSTS
    assert hosts[-1] == f"n{MAX_HOSTS}"


def test_first_host_and_count_do_not_expand() -> None:
    # 10**20 hosts: expanding them could not finish; the limit makes expand() refuse them.
    huge = "node[1-100000000000000000000],x"
    assert first_host(huge) == "node1"
    assert count(huge) == 10**20 + 1
    assert first_host("rack[07-99]-n[0003-9999]") == "rack07-n0003"
    with pytest.raises(ConfigError, match="more than"):
        expand(huge)


# Each error case: the text, and a fragment the message must contain.
EXPAND_ERRORS = [
    ("", "empty"),
    ("n[1-3", "never closed"),
    ("n[1-3],m[4", "never closed"),
    ("n1-3]", "no matching"),
    ("n]", "no matching"),
    ("n[[1]]", "inside another bracket"),
    ("n[1[2]]", "inside another bracket"),
    ("n[5-3]", "reversed"),
    ("n[1,5-3]", "reversed"),
    ("n[a-b]", "not a number"),
    ("n[1-b]", "not a number"),
    ("n[x]", "not a number"),
    ("n[1-]", "not a number"),
    ("n[-1]", "not a number"),
    ("n[1--3]", "not a number"),
    ("n[+1-2]", "not a number"),
    ("n[1-2-3]", "not a number"),
    ("n[\u0663]", "not a number"),  # an Arabic-Indic digit is not a hostlist number
    ("n[]", "empty brackets"),
    ("n[1,,2]", "empty entry"),
    ("n[1,]", "empty entry"),
    ("a,,b", "empty item"),
    (",n1", "empty item"),
    ("n1,", "trailing"),
    ("a b", "not allowed"),
    ("n[1-2]\n", "not allowed"),
    ("n\t1", "not allowed"),
    ("n[ 1-2]", "not a number"),
    ("n\x00", "not allowed"),
    (f"n[1-{MAX_HOSTS + 1}]", "more than"),
    ("n[1-1000][1-1001]", "more than"),
    ("a[1-600000],b[1-600000]", "more than"),
    ("n[1-" + "9" * 25 + "]", "more than"),
    ("n[1-" + "9" * 25 + "][1-" + "9" * 25 + "]", "more than"),
    ("n[" + "1" * 40 + "]", "digits"),
]


@pytest.mark.parametrize(("text", "fragment"), EXPAND_ERRORS)
def test_expand_errors_name_the_variable(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        expand(text, variable="SLURM_JOB_NODELIST")
    message = str(info.value)
    assert message.startswith(f"SLURM_JOB_NODELIST={text!r}: ")
    assert fragment in message
    assert "HINT:" in message
    assert info.value.variable == "SLURM_JOB_NODELIST"
    assert info.value.value == text


@pytest.mark.parametrize(("text", "fragment"), EXPAND_ERRORS)
def test_expand_errors_without_variable_show_the_text(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        expand(text)
    message = str(info.value)
    assert message.startswith(f"hostlist {text!r}: ")
    assert fragment in message
    assert "\n" not in message.replace(repr(text), "")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [(text, fragment) for text, fragment in EXPAND_ERRORS if fragment != "more than"],
)
def test_first_host_and_count_check_the_whole_text(text: str, fragment: str) -> None:
    for function in (first_host, count):
        with pytest.raises(ConfigError, match="SLURM_STEP_NODELIST") as info:
            function(text, variable="SLURM_STEP_NODELIST")
        assert fragment in str(info.value)


def test_first_host_rejects_errors_after_the_first_item() -> None:
    with pytest.raises(ConfigError, match="reversed"):
        first_host("n1,n[5-3]")


def test_reversed_range_hint_shows_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"HINT: write the low bound first: \[3-5\]"):
        expand("n[5-3]")


# --------------------------------------------------------------------------------------------
# compress


COMPRESS_CASES = [
    (["n1", "n2", "n3"], "n[1-3]"),
    ([f"n{i:02d}" for i in range(1, 11)], "n[01-10]"),
    (["n8", "n9", "n10", "n11"], "n[8-11]"),
    (["n08", "n09", "n10"], "n[08-10]"),
    (["n99", "n100"], "n[99-100]"),
    (["n8", "n09"], "n[8,09]"),
    (["n09", "n8"], "n[09,8]"),
    (["n3", "n2", "n1"], "n[3,2,1]"),
    (["n1", "n1"], "n[1,1]"),
    (["n1", "n2", "n4", "m5"], "n[1-2,4],m5"),
    (["a1", "b1", "a2"], "a1,b1,a2"),
    (["host"], "host"),
    (["n5"], "n5"),
    (["n007"], "n007"),
    (["12", "13", "14"], "[12-14]"),
    (
        ["gpu-a100-01.cluster.org", "gpu-a100-02.cluster.org"],
        "gpu-a100-01.cluster.org,gpu-a100-02.cluster.org",
    ),
    (
        [f"rack{r}-node{n:02d}" for r in (1, 2) for n in (1, 2, 3)],
        "rack1-node[01-03],rack2-node[01-03]",
    ),
    (["a1b", "a2b"], "a1b,a2b"),  # never text after a bracket: Slurm must accept the result
    (["n1", "x", "n2"], "n1,x,n2"),
    (["n0", "n00", "n01", "n02"], "n[0,00-02]"),
    (["n" + "1" * 40, "n" + "1" * 39 + "2"], "n" + "1" * 40 + ",n" + "1" * 39 + "2"),
]


@pytest.mark.parametrize(("hosts", "text"), COMPRESS_CASES)
def test_compress(hosts: list[str], text: str) -> None:
    assert compress(hosts) == text
    assert expand(text) == hosts


def test_compress_accepts_any_sequence() -> None:
    assert compress(("n1", "n2")) == "n[1-2]"


@pytest.mark.parametrize(
    ("hosts", "fragment"),
    [
        ([], "empty list"),
        ([""], "empty"),
        (["n1", "n[2]"], "'['"),
        (["a,b"], "','"),
        (["a]"], "']'"),
        (["a b"], "' '"),
        (["a\n"], "'\\n'"),
        ([3], "not a string"),
    ],
)
def test_compress_errors(hosts: list[Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        compress(hosts, variable="--hosts")
    assert fragment in str(info.value)
    assert "--hosts" in str(info.value)


def test_compress_rejects_a_single_string() -> None:
    with pytest.raises(TypeError, match="not a str"):
        compress("n1")


# --------------------------------------------------------------------------------------------
# expand_tasks_per_node


@pytest.mark.parametrize(
    ("text", "counts"),
    [
        ("2(x3),1", [2, 2, 2, 1]),
        ("4", [4]),
        ("1(x2),3(x1),2", [1, 1, 3, 2]),
        ("16(x1)", [16]),
        ("1,2,3", [1, 2, 3]),
        ("02", [2]),
    ],
)
def test_expand_tasks_per_node(text: str, counts: list[int]) -> None:
    assert expand_tasks_per_node(text) == counts


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty"),
        ("0", "zero"),
        ("2,0", "zero"),
        ("2(x0)", "zero"),
        ("-1", "not N or N(xM)"),
        ("2(x-1)", "not N or N(xM)"),
        ("2(x)", "not N or N(xM)"),
        ("2x3", "not N or N(xM)"),
        ("2(x3", "not N or N(xM)"),
        ("(x3)", "not N or N(xM)"),
        ("a", "not N or N(xM)"),
        ("2,,1", "not N or N(xM)"),
        ("2,", "not N or N(xM)"),
        (" 2", "not N or N(xM)"),
        ("1.5", "not N or N(xM)"),
        ("1(x2000000)", "more than"),
        ("1(x600000),1(x600000)", "more than"),
        ("1" * 40, "digits"),
    ],
)
def test_expand_tasks_per_node_errors(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        expand_tasks_per_node(text, variable="SLURM_TASKS_PER_NODE")
    message = str(info.value)
    assert message.startswith(f"SLURM_TASKS_PER_NODE={text!r}: ")
    assert fragment in message
    with pytest.raises(ConfigError, match=r"^task counts "):
        expand_tasks_per_node(text)


@pytest.mark.parametrize(("counts", "text"), [
    ([2, 1], "2,1"), ([4] * 4096, "4(x4096)"), ([2, 2, 2, 1, 3, 3], "2(x3),1,3(x2)"), ([1], "1"),
])
def test_compress_tasks_per_node(counts: list[int], text: str) -> None:
    assert compress_tasks_per_node(counts) == text
    assert expand_tasks_per_node(text) == counts


@pytest.mark.parametrize("counts", [[], [2, 0]])
def test_compress_tasks_per_node_needs_counts_of_one_or_more(counts: list[int]) -> None:
    with pytest.raises(ConfigError, match="every node runs at least one"):
        compress_tasks_per_node(counts)


# --------------------------------------------------------------------------------------------
# properties

_NAME_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._"


@st.composite
def _runs(draw: st.DrawFn) -> list[str]:
    """A run of hosts that share a prefix: counting up, down, or shuffled, some zero-padded."""
    prefix = draw(st.text(alphabet=_NAME_CHARS, max_size=8))
    start = draw(st.integers(min_value=0, max_value=120))
    length = draw(st.integers(min_value=1, max_value=15))
    width = draw(st.integers(min_value=0, max_value=4))
    suffix = draw(st.sampled_from(["", "", "", ".cluster.org", "a", "-ib"]))
    names = [f"{prefix}{str(n).zfill(width)}{suffix}" for n in range(start, start + length)]
    order = draw(st.sampled_from(["up", "down", "shuffled"]))
    if order == "down":
        names.reverse()
    elif order == "shuffled":
        names = draw(st.permutations(names))
    return names


_host_names = st.one_of(
    st.text(alphabet=_NAME_CHARS, min_size=1, max_size=12),
    st.text(
        alphabet=st.characters(exclude_characters="[],", exclude_categories=["Z", "C"]),
        min_size=1,
        max_size=6,
    ),
)

_host_lists = (
    st.lists(
        st.one_of(_runs(), st.lists(_host_names, min_size=1, max_size=3)), min_size=1, max_size=8
    )
    .map(lambda chunks: [host for chunk in chunks for host in chunk])
    .filter(bool)
)


@given(_host_lists)
def test_expand_inverts_compress(hosts: list[str]) -> None:
    text = compress(hosts)
    assert expand(text) == hosts
    assert count(text) == len(hosts)
    assert first_host(text) == hosts[0]


@given(_host_lists)
def test_compress_never_puts_text_after_a_bracket(hosts: list[str]) -> None:
    # Slurm rejects a suffix after the last bracket; every item must end with ']' or have none.
    depth = 0
    item_tail = ""
    for char in compress(hosts) + ",":
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if depth == 0 and char == ",":
            assert "]" not in item_tail
            item_tail = ""
        elif char == "]":
            item_tail = ""
        else:
            item_tail += char


@given(st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=60))
def test_compress_merges_consecutive_numbers(numbers: list[int]) -> None:
    hosts = [f"node{n}" for n in numbers]
    text = compress(hosts)
    assert expand(text) == hosts
    # every +1 step joins a range, every other step starts a new bracket entry
    entries = text.count(",") + 1 if "[" in text else 1
    assert entries == 1 + sum(1 for a, b in zip(numbers, numbers[1:]) if b != a + 1)


@settings(deadline=None)
@given(st.text())
def test_expand_raises_only_config_error_on_any_text(text: str) -> None:
    try:
        hosts = expand(text)
    except ConfigError as error:
        assert str(error)
    else:
        assert hosts
        assert all(hosts)


@settings(deadline=None)
@given(st.text(alphabet="n01239-[],.x", max_size=30))
def test_expand_raises_only_config_error_on_hostlist_like_text(text: str) -> None:
    try:
        hosts = expand(text)
    except ConfigError as error:
        if "more than" in str(error):  # well-formed but too big: only expand() refuses it
            assert count(text) > MAX_HOSTS
        else:
            with pytest.raises(ConfigError):
                first_host(text)
    else:
        assert count(text) == len(hosts)
        assert first_host(text) == hosts[0]
        if len(hosts) <= 10_000:
            assert expand(compress(hosts)) == hosts


@given(st.text(alphabet="0123(x),-", max_size=20))
def test_expand_tasks_per_node_raises_only_config_error(text: str) -> None:
    try:
        counts = expand_tasks_per_node(text)
    except ConfigError as error:
        assert "task counts" in str(error)
    else:
        assert counts
        assert all(c >= 1 for c in counts)


# --------------------------------------------------------------------------------------------
# the real thing: scontrol show hostnames


def _random_hostlist(rng: random.Random) -> str:
    """A hostlist scontrol accepts: ranges, padding, several bracket groups, commas inside and
    outside brackets, and no text after the last bracket of an item."""
    items = []
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.2:
            items.append(rng.choice(["login", "gpu-a100-01.cluster.org", "c1002a-s5", "n7"]))
            continue
        item = ""
        for group in range(rng.randint(1, 4)):
            if group == 0:
                item += rng.choice(["node", "n", "rack", "c1001a-s", "gpu-a100-", "x.y", "n1", ""])
            else:
                item += rng.choice(["-node", "-", "", ".", "s", "0"])
            entries = []
            for _ in range(rng.randint(1, 3)):
                lo = rng.randint(0, 120)
                width = rng.choice([0, 0, 1, 2, 3, 4])
                lo_text = str(lo).zfill(width)
                if rng.random() < 0.4:
                    entries.append(lo_text)
                else:
                    hi = lo + rng.randint(0, 4)
                    entries.append(f"{lo_text}-{str(hi).zfill(rng.choice([0, width]))}")
            item += "[" + ",".join(entries) + "]"
        items.append(item)
    return ",".join(items)


@pytest.mark.slurm
def test_matches_scontrol_show_hostnames(slurm_testbed: object) -> None:
    """``expand`` lists the same hosts as Slurm's own parser for ~300 seeded random hostlists."""
    scontrol = shutil.which("scontrol") or "/usr/bin/scontrol"
    rng = random.Random(20240601)
    hostlists = [_random_hostlist(rng) for _ in range(300)]
    mismatches = []
    for hostlist in hostlists:
        result = subprocess.run(
            [scontrol, "show", "hostnames", hostlist],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        # scontrol exits 0 even on "Invalid hostlist"; it says so on stderr
        rejected = result.returncode != 0 or "Invalid hostlist" in result.stderr
        assert not rejected, f"scontrol rejected {hostlist!r}: {result.stderr.strip()}"
        expected = result.stdout.split()
        assert expected, f"scontrol listed no host for {hostlist!r}"
        if expand(hostlist) != expected:
            mismatches.append((hostlist, expand(hostlist), expected))
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[0]}"
    assert sum("][" in h or "]-" in h or "]." in h for h in hostlists) > 50  # multi-group cases
