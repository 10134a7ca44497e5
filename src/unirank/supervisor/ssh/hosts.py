"""The hosts of ``unirank run --hosts/--hostfile``, parsed (pure: text in, hosts or ConfigError
out).

Accepted forms, one host each:

- ``--hosts node1:4,node2:4`` (``host`` alone: no slot count);
- a hostfile: DeepSpeed's and Open MPI's ``host slots=N``, MPICH's and Open MPI's ``host:N``,
  a bare ``host``; ``#`` starts a comment, blank lines are skipped, ``max_slots=`` is ignored;
- ``--include`` / ``--exclude`` as DeepSpeed's: host names separated by ``@``.

Reads no environment variable.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from unirank.errors import ConfigError

__all__ = ["Host", "common_slots", "parse_hostfile", "parse_hosts", "select_hosts"]

_NAME = re.compile(r"^[A-Za-z0-9_.@\-\[\]:]+$")


@dataclass(frozen=True)
class Host:
    """One host of the list: the name ssh is given (``user@`` allowed), its slots (None: not
    said)."""

    name: str
    slots: int | None = None


def _slots(text: str, where: str, value: str) -> int:
    try:
        slots = int(text)
    except ValueError:
        slots = 0
    if slots < 1:
        raise ConfigError(f"has a slot count that is not a positive integer: {text!r}",
                          variable=where, value=value,
                          hint="write host:N or host slots=N with N >= 1")
    return slots


def _check_name(name: str, where: str, value: str) -> str:
    if not name or not _NAME.match(name) or name.startswith("-"):
        raise ConfigError(f"is not a host name: {name!r}", variable=where, value=value,
                          hint="give host names or addresses (user@host allowed), e.g. "
                          "node1:4,node2:4")
    return name


def _host_colon(item: str, where: str) -> Host:
    """``host`` or ``host:N`` (an IPv6 address in brackets: ``[::1]:4``, kept without them, as
    ssh takes it)."""
    name, sep, count = item.rpartition(":")
    if not sep or "]" in count or (":" in name and not name.endswith("]")):
        return Host(_check_name(item, where, item).strip("[]"))
    return Host(_check_name(name, where, item).strip("[]"), _slots(count, where, item))


def parse_hosts(text: str, where: str = "--hosts") -> list[Host]:
    """``node1:4,node2:4`` -> hosts, in order."""
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise ConfigError("names no host", variable=where, value=text,
                          hint="e.g. --hosts node1:4,node2:4")
    return _no_repeats([_host_colon(item, where) for item in items if item], where)


def parse_hostfile(text: str, path: str) -> list[Host]:
    """A hostfile's text -> hosts, in order (``path`` names it in errors)."""
    hosts = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{number}"
        first, *rest = line.split()
        slots = None
        for word in rest:
            key, sep, value = word.partition("=")
            if key == "slots" and sep:
                slots = _slots(value, where, line)
            elif key != "max_slots" or not sep:
                raise ConfigError(f"has {word!r}, which a hostfile line does not take",
                                  variable=where, value=line,
                                  hint="write 'host slots=N' or 'host:N', one host a line")
        host = _host_colon(first, where)
        if slots is not None and host.slots is not None:
            raise ConfigError("gives the slots twice", variable=where, value=line,
                              hint="write 'host slots=N' or 'host:N'")
        hosts.append(Host(host.name, slots if slots is not None else host.slots))
    if not hosts:
        raise ConfigError("names no host", variable="--hostfile", value=path,
                          hint="write one host a line: 'node1 slots=4'")
    return _no_repeats(hosts, "--hostfile")


def _no_repeats(hosts: list[Host], where: str) -> list[Host]:
    seen: set[str] = set()
    for host in hosts:
        if host.name in seen:
            raise ConfigError(f"names {host.name} twice", variable=where, value=host.name,
                              hint="name each host once, with all its slots")
        seen.add(host.name)
    return hosts


def _filter_names(text: str, option: str, hosts: Sequence[Host]) -> set[str]:
    names = {item.strip() for item in text.split("@") if item.strip()}
    known = {host.name for host in hosts}
    for name in sorted(names):
        if ":" in name and name not in known:
            raise ConfigError("selects slots; unirank selects whole hosts", variable=option,
                              value=text, hint="name hosts separated by @ (node1@node2); "
                              "choose GPUs with -x CUDA_VISIBLE_DEVICES")
        if name not in known:
            raise ConfigError(f"names {name}, which is not in the host list", variable=option,
                              value=text, hint="known hosts: " + ",".join(sorted(known)))
    return names


def select_hosts(hosts: Sequence[Host], include: str | None,
                 exclude: str | None) -> list[Host]:
    """DeepSpeed's ``--include`` / ``--exclude`` (``node1@node2``): the hosts kept, in order."""
    if include and exclude:
        raise ConfigError("cannot be combined with --exclude", variable="--include",
                          value=include, hint="give one of the two")
    kept = list(hosts)
    if include:
        names = _filter_names(include, "--include", hosts)
        kept = [host for host in hosts if host.name in names]
    if exclude:
        names = _filter_names(exclude, "--exclude", hosts)
        kept = [host for host in hosts if host.name not in names]
    if not kept:
        raise ConfigError("leaves no host", variable="--exclude", value=exclude,
                          hint="keep at least one host")
    return kept


def common_slots(hosts: Sequence[Host]) -> int | None:
    """The workers per host: every host's slots when they agree, None when none says; a
    ConfigError when they differ (unirank run starts the same number on every node)."""
    counts = {host.slots for host in hosts}
    if len(counts) == 1:
        return counts.pop()
    shown = ",".join(f"{h.name}:{h.slots if h.slots is not None else '?'}" for h in hosts)
    raise ConfigError("gives the hosts different slot counts", variable="hosts", value=shown,
                      hint="give every host the same slots, or pass --nproc-per-node N")
