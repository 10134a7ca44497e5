"""Slurm hostlists: ``node[01-04],gpu7`` <-> ``["node01", ..., "node04", "gpu7"]``.

Pure text processing; nothing here reads the environment or runs a program. The functions take
the text itself plus, optionally, the name of the variable it came from (``SLURM_JOB_NODELIST``,
``SLURM_STEP_NODELIST``, ``SLURM_TASKS_PER_NODE``, ...) so that an error names it.

Syntax accepted by :func:`expand` (the one ``scontrol show hostnames`` understands):

* items separated by commas: ``a1,b[2-3],c``;
* in an item, any number of bracket groups: ``rack[1-2]-node[01-03]``; the expansion is their
  cartesian product, with the first group varying slowest when there are two (``rack1-node01``,
  ``rack1-node02``, ..., ``rack2-node01``, ...). With three or more, Slurm nests them oddly and
  so does unirank: ``a[1-2]b[3-4]c[5-6]`` varies ``b`` slowest, then ``a``, then ``c``
  (``a1b3c5 a1b3c6 a2b3c5 a2b3c6 a1b4c5 ...``): the last group is innermost and the others
  nest right to left;
* in a bracket, a comma list of numbers and ranges ``lo-hi``: ``n[1,3,5-6]``;
* zero padding: a range's numbers are padded to the width of its *first* bound, as Slurm does:
  ``node[08-11]`` gives ``node08 .. node11``, ``node[8-011]`` gives ``node8 .. node11``;
* order and duplicates are kept as written.

Where unirank differs from Slurm 22.05's parser:

* text after the last bracket (``a[1-2]b`` -> ``a1b``, ``a2b``) is accepted; Slurm rejects it
  with "Invalid hostlist". :func:`compress` never produces it, so its output suits Slurm too;
* Slurm silently drops empty items (``a,,b``), reads ``n[1-]`` as ``n1`` and ``n[1-3`` as
  ``n]``, and takes whitespace as a separator; all of these are errors here.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NoReturn, Union

from unirank.errors import ConfigError

__all__ = [
    "MAX_DIGITS",
    "MAX_HOSTS",
    "compress",
    "compress_tasks_per_node",
    "count",
    "expand",
    "expand_tasks_per_node",
    "first_host",
]

MAX_HOSTS = 1_000_000
"""The most hosts (or task counts) one text may expand to; more is taken as a malformed value."""

MAX_DIGITS = 30
"""The longest number accepted in a bracket or a task count."""

_SPECIAL = frozenset("[],")
_ASCII_DIGITS = frozenset("0123456789")
_HINT = "write a Slurm hostlist such as node[01-04],gpu7"
_NUMBER = re.compile(r"[0-9]+")
_TASKS_ITEM = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")


@dataclass(frozen=True)
class _Range:
    """Numbers ``lo..hi`` (inclusive), each zero-padded to ``width`` digits."""

    lo: int
    hi: int
    width: int

    def size(self) -> int:
        """How many numbers the range holds (may exceed what ``len()`` can return)."""
        return self.hi - self.lo + 1

    def render(self, number: int) -> str:
        """``number`` as it appears in a host name."""
        return str(number).zfill(self.width)


_Group = tuple[_Range, ...]
_Part = Union[str, _Group]
_Item = tuple[_Part, ...]


def _fail(text: str, variable: str | None, what: str, hint: str = _HINT) -> NoReturn:
    """Raise the ConfigError for ``text``: the variable (or the text itself) and what is wrong."""
    if variable is None:
        raise ConfigError(f"hostlist {text!r}: {what}", hint=hint)
    raise ConfigError(what, variable=variable, value=text, hint=hint)


def _valid_char(char: str) -> bool:
    """Whether ``char`` may appear in a host name (printable, not a space, not ``[],``)."""
    return char.isprintable() and not char.isspace() and char not in _SPECIAL


def _parse_number(text: str, variable: str | None, digits: str, entry: str) -> int:
    """The value of the bound ``digits`` of bracket entry ``entry``."""
    if not _NUMBER.fullmatch(digits):
        _fail(text, variable, f"{entry!r} in brackets is not a number or a range lo-hi")
    if len(digits) > MAX_DIGITS:
        _fail(text, variable, f"number {digits[:12]}... in brackets has over {MAX_DIGITS} digits")
    return int(digits)


def _parse_group(text: str, variable: str | None, inner: str, at: int) -> _Group:
    """The ranges of the bracket whose contents ``inner`` start at position ``at``."""
    if not inner:
        _fail(text, variable, f"empty brackets at position {at - 1}")
    ranges: list[_Range] = []
    for entry in inner.split(","):
        if not entry:
            _fail(text, variable, f"empty entry in brackets [{inner}]")
        lo_text, dash, hi_text = entry.partition("-")
        lo = _parse_number(text, variable, lo_text, entry)
        hi = _parse_number(text, variable, hi_text, entry) if dash else lo
        if hi < lo:
            _fail(
                text,
                variable,
                f"range {entry} is reversed",
                hint=f"write the low bound first: [{hi_text}-{lo_text}]",
            )
        ranges.append(_Range(lo, hi, len(lo_text)))
    return tuple(ranges)


def _parse(text: str, variable: str | None) -> list[_Item]:
    """Check ``text``'s syntax and split it into items of literal parts and bracket groups."""
    if not text:
        _fail(text, variable, "is empty")
    items: list[_Item] = []
    parts: list[_Part] = []
    literal: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "[":
            close = text.find("]", i + 1)
            if close < 0:
                _fail(text, variable, f"'[' at position {i} is never closed")
            nested = text.find("[", i + 1, close)
            if nested >= 0:
                _fail(text, variable, f"'[' at position {nested} is inside another bracket")
            if literal:
                parts.append("".join(literal))
                literal = []
            parts.append(_parse_group(text, variable, text[i + 1 : close], i + 1))
            i = close + 1
            continue
        if char == "]":
            _fail(text, variable, f"']' at position {i} has no matching '['")
        if char == ",":
            if not literal and not parts:
                _fail(text, variable, f"empty item before the ',' at position {i}")
            if literal:
                parts.append("".join(literal))
                literal = []
            items.append(tuple(parts))
            parts = []
        elif _valid_char(char):
            literal.append(char)
        else:
            _fail(
                text,
                variable,
                f"character {char!r} at position {i} is not allowed in a hostlist",
                hint="separate hosts with commas, without spaces: node[1-2],gpu7",
            )
        i += 1
    if not literal and not parts:
        _fail(text, variable, "ends with an empty item (a trailing ',')")
    if literal:
        parts.append("".join(literal))
    items.append(tuple(parts))
    return items


def _item_size(item: _Item) -> int:
    """How many hosts ``item`` expands to."""
    size = 1
    for part in item:
        if not isinstance(part, str):
            size *= sum(r.size() for r in part)
    return size


def _group_strings(group: _Group) -> list[str]:
    """The numbers of a bracket group, as they appear in host names, in order."""
    return [r.render(n) for r in group for n in range(r.lo, r.hi + 1)]


def _expand_item(item: _Item) -> Iterator[str]:
    """The hosts of one item, its bracket groups nested as Slurm nests them.

    With groups ``g1 .. gk``, Slurm's parser loops over ``g(k-1)`` outermost, then ``g(k-2)``,
    ..., ``g1``, and ``gk`` innermost: for one or two groups that is the plain cartesian product
    with the first group varying slowest, for three or more it is not.
    """
    groups = [(index, part) for index, part in enumerate(item) if not isinstance(part, str)]
    nesting = groups[-2::-1] + groups[-1:]
    slots = [index for index, _ in nesting]
    pools = [_group_strings(group) for _, group in nesting]
    pieces = [part if isinstance(part, str) else "" for part in item]
    for combination in itertools.product(*pools):
        for index, number in zip(slots, combination):
            pieces[index] = number
        yield "".join(pieces)


def expand(hostlist: str, *, variable: str | None = None) -> list[str]:
    """The host names of Slurm hostlist ``hostlist``, as ``scontrol show hostnames`` lists them.

    ``expand("rack[1-2]-n[08-09],gpu7")`` is ``["rack1-n08", "rack1-n09", "rack2-n08",
    "rack2-n09", "gpu7"]``. See the module docstring for the syntax, including the one extension
    over Slurm (text after the last bracket, ``a[1-2]b``, is accepted).

    Reads no environment variable; ``variable`` only names, in errors, where the text came from.
    Raises ConfigError on an empty text, unbalanced or nested brackets, a reversed range, a
    bound that is not a number, an empty item or bracket entry, whitespace, or an expansion of
    more than ``MAX_HOSTS`` hosts (so a malformed value cannot exhaust memory).
    """
    items = _parse(hostlist, variable)
    total = 0
    for item in items:
        total += _item_size(item)
        if total > MAX_HOSTS:
            _fail(
                hostlist,
                variable,
                f"expands to more than {MAX_HOSTS} hosts",
                hint="check the ranges' bounds",
            )
    hosts: list[str] = []
    for item in items:
        hosts.extend(_expand_item(item))
    return hosts


def first_host(hostlist: str, *, variable: str | None = None) -> str:
    """The first host of ``hostlist``, without expanding it: ``node[1-100000]`` costs no more
    than ``node1``.

    The whole text is checked as :func:`expand` checks it, so a malformed value raises
    ConfigError here too; only the ``MAX_HOSTS`` limit is not applied, since nothing is
    expanded. Reads no environment variable; ``variable`` names the text's source in errors.
    """
    items = _parse(hostlist, variable)
    return "".join(
        part if isinstance(part, str) else part[0].render(part[0].lo) for part in items[0]
    )


def count(hostlist: str, *, variable: str | None = None) -> int:
    """How many hosts ``hostlist`` names (duplicates included), without expanding it.

    Raises ConfigError on malformed text as :func:`expand` does, but applies no size limit.
    Reads no environment variable; ``variable`` names the text's source in errors.
    """
    return sum(_item_size(item) for item in _parse(hostlist, variable))


def _split_host(host: str) -> tuple[str, str] | None:
    """``(prefix, digits)`` when ``host`` ends in a number short enough to bracket, else None."""
    start = len(host)
    while start > 0 and host[start - 1] in _ASCII_DIGITS:
        start -= 1
    if start == len(host) or len(host) - start > MAX_DIGITS:
        return None
    return host[:start], host[start:]


def _check_host(host: str, variable: str | None) -> None:
    """Raise ConfigError unless ``host`` is a name :func:`expand` reads back as itself."""
    if not isinstance(host, str):
        raise ConfigError(
            f"host {host!r} is not a string", variable=variable, hint="pass host names as str"
        )
    if not host:
        raise ConfigError("a host name is empty", variable=variable, hint="drop the empty name")
    bad = next((char for char in host if not _valid_char(char)), None)
    if bad is not None:
        raise ConfigError(
            f"host name {host!r} contains {bad!r}, which cannot appear in a hostlist",
            variable=variable,
            hint="host names must not contain '[', ']', ',' or whitespace",
        )


@dataclass
class _Run:
    """Consecutive numbers ``first..last`` of one bracket, padded like ``first_digits``."""

    first_digits: str
    last: int

    def extends_to(self, digits: str) -> bool:
        """Whether the number ``digits`` continues this run (next value, same padding)."""
        value = int(digits)
        return value == self.last + 1 and str(value).zfill(len(self.first_digits)) == digits

    def render(self) -> str:
        """The run as a bracket entry: ``07`` or ``07-10``."""
        if int(self.first_digits) == self.last:
            return self.first_digits
        return f"{self.first_digits}-{str(self.last).zfill(len(self.first_digits))}"


def compress(hosts: Sequence[str], *, variable: str | None = None) -> str:
    """A compact Slurm hostlist for ``hosts``, such that ``expand(compress(hosts)) == hosts``.

    Order and duplicates are kept: only hosts that follow each other in ``hosts`` and differ
    only in their trailing number are merged, ``["n1", "n2", "n3", "n5", "m1"]`` giving
    ``n[1-3,5],m1``, and a range only joins numbers of one padding width (``n08,n09,n10`` gives
    ``n[08-10]``, ``n8,n09`` gives ``n[8,09]``). Only a *trailing* number is bracketed, so the
    result never has text after a bracket and Slurm accepts it too; names without one
    (``gpu-01.cluster.org``) are listed as they are.

    Reads no environment variable; ``variable`` names the source of ``hosts`` in errors.
    Raises ConfigError for an empty sequence or a name that is empty or contains ``[``, ``]``,
    ``,`` or whitespace; TypeError when ``hosts`` is a single ``str``.
    """
    if isinstance(hosts, str):
        raise TypeError("compress() takes a sequence of host names, not a str")
    if not hosts:
        raise ConfigError(
            "cannot write an empty list of hosts as a hostlist",
            variable=variable,
            hint="pass at least one host name",
        )
    out: list[str] = []
    prefix: str | None = None  # prefix of the open bracket group, None when there is none
    runs: list[_Run] = []

    def close_group() -> None:
        if prefix is None:
            return
        if len(runs) == 1 and int(runs[0].first_digits) == runs[0].last:
            out.append(prefix + runs[0].first_digits)
        else:
            out.append(f"{prefix}[{','.join(run.render() for run in runs)}]")

    for host in hosts:
        _check_host(host, variable)
        split = _split_host(host)
        if split is None:
            close_group()
            prefix, runs = None, []
            out.append(host)
            continue
        host_prefix, digits = split
        if host_prefix != prefix:
            close_group()
            prefix, runs = host_prefix, []
        if runs and runs[-1].extends_to(digits):
            runs[-1].last += 1
        else:
            runs.append(_Run(digits, int(digits)))
    close_group()
    return ",".join(out)


def expand_tasks_per_node(text: str, *, variable: str | None = None) -> list[int]:
    """The task counts of Slurm's compressed form: ``"2(x3),1"`` is ``[2, 2, 2, 1]``.

    This is the form of ``SLURM_TASKS_PER_NODE`` and ``SLURM_JOB_CPUS_PER_NODE``: comma-separated
    items ``N`` or ``N(xM)`` (``N`` repeated ``M`` times), with ``N, M >= 1``. Reads no
    environment variable; ``variable`` names the text's source in errors. Raises ConfigError on
    malformed text, a zero or negative count, or more than ``MAX_HOSTS`` counts in all.
    """
    hint = "expected counts such as 2(x3),1"

    def fail(what: str) -> NoReturn:
        if variable is None:
            raise ConfigError(f"task counts {text!r}: {what}", hint=hint)
        raise ConfigError(what, variable=variable, value=text, hint=hint)

    if not text:
        fail("is empty")
    counts: list[int] = []
    for item in text.split(","):
        match = _TASKS_ITEM.fullmatch(item)
        if match is None:
            fail(f"{item!r} is not N or N(xM) with whole numbers N, M >= 1")
        tasks_text, repeat_text = match.group(1), match.group(2) or "1"
        if len(tasks_text) > MAX_DIGITS or len(repeat_text) > MAX_DIGITS:
            fail(f"{item!r} has a number over {MAX_DIGITS} digits")
        tasks, repeat = int(tasks_text), int(repeat_text)
        if tasks == 0 or repeat == 0:
            fail(f"{item!r} has a zero count; every count must be at least 1")
        if len(counts) + repeat > MAX_HOSTS:
            fail(f"lists more than {MAX_HOSTS} nodes")
        counts.extend([tasks] * repeat)
    return counts


def compress_tasks_per_node(counts: Sequence[int]) -> str:
    """Slurm's compressed form of task counts, the inverse of :func:`expand_tasks_per_node`:
    ``[2, 2, 2, 1]`` is ``"2(x3),1"``. Reads no environment variable; raises ConfigError for
    an empty sequence or a count below 1."""
    if not counts or min(counts) < 1:
        raise ConfigError(f"task counts {list(counts)!r}: every node runs at least one",
                          hint="pass one count >= 1 a node")
    items = []
    for count, run in itertools.groupby(counts):
        repeat = len(list(run))
        items.append(f"{count}(x{repeat})" if repeat > 1 else str(count))
    return ",".join(items)
