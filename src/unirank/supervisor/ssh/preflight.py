"""Before any worker starts: every host checked in parallel over ssh.

One ssh per host (``BatchMode``, ``ConnectTimeout``) runs a short shell line there: ``cd`` to
this working directory, the same interpreter path, then that interpreter reports its Python,
unirank and torch versions (torch is found and its version read from its metadata, not
imported: that costs seconds and happens in the workers anyway) and, on the first host, a free
port for the store. A host that fails is named in one line: unreachable (ssh's own message),
no such folder, no such interpreter, unirank or torch missing, or versions unlike this host's.

Reads no environment variable (its callers pass the mapping).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from unirank.supervisor.ssh.remote import DEFAULT_CONNECT_TIMEOUT, ssh_command

__all__ = ["HostFacts", "Refusal", "check_hosts", "local_versions", "ssh_hostname"]

#: seconds a host's check may take beyond ssh's ConnectTimeout (login and the interpreter)
CHECK_SLACK_S = 20.0
_MARK = "UNIRANK-PREFLIGHT"
_NO_CWD, _NO_PYTHON = 97, 98
_PROBE = """
import importlib.metadata as m, importlib.util as u, json, socket, sys
def v(n):
    try:
        return m.version(n)
    except Exception:
        return None
r = {"python": sys.version.split()[0], "torch": v("torch") if u.find_spec("torch") else None}
try:
    import unirank
    r["unirank"] = unirank.__version__
except Exception as e:
    r["unirank_error"] = repr(e)
if PORT:
    s = socket.socket()
    s.bind(("", 0))
    r["port"] = s.getsockname()[1]
    s.close()
print("MARK " + json.dumps(r), flush=True)
"""


@dataclass(frozen=True)
class HostFacts:
    """What a host's check reported."""

    host: str
    python: str
    unirank: str
    torch: str
    port: int | None = None


@dataclass(frozen=True)
class Refusal:
    """A host that failed its check, and why (one line)."""

    host: str
    reason: str

    def line(self) -> str:
        return f"host {self.host}: {self.reason}"


def local_versions(python_version: str) -> dict[str, str | None]:
    """This host's versions, read as the probe reads them (torch not imported)."""
    import importlib.metadata as metadata

    import unirank

    try:
        torch: str | None = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = None
    return {"python": python_version, "unirank": unirank.__version__, "torch": torch}


def probe_line(cwd: str, python: str, pythonpath: str | None, *, port: bool) -> str:
    """The shell line a host runs for its check."""
    code = _PROBE.replace("PORT", "True" if port else "False").replace("MARK", _MARK)
    command = ["env", f"PYTHONPATH={pythonpath}"] if pythonpath is not None else []
    command += [python, "-c", code]
    return (f"cd -- {shlex.quote(cwd)} 2>/dev/null || exit {_NO_CWD}; "
            f"test -x {shlex.quote(python)} || exit {_NO_PYTHON}; exec {shlex.join(command)}")


def _verdict(host: str, code: int, out: str, err: str, cwd: str, python: str,
             local: Mapping[str, str | None]) -> HostFacts | Refusal:
    if code == 255:
        last = (err.strip().splitlines() or ["no message"])[-1]
        return Refusal(host, f"ssh cannot reach it or log in: {last}")
    if code == _NO_CWD:
        return Refusal(host, f"has no folder {cwd} (the job runs in the same working directory "
                       "on every host)")
    if code == _NO_PYTHON:
        return Refusal(host, f"has no interpreter {python} (every host runs the same path; "
                       "install the same environment there)")
    report = next((line[len(_MARK) + 1:] for line in out.splitlines()
                   if line.startswith(_MARK + " ")), None)
    if code != 0 or report is None:
        last = (err.strip().splitlines() or [f"exit code {code}"])[-1]
        return Refusal(host, f"its check failed: {last}")
    facts = json.loads(report)
    if "unirank_error" in facts:
        return Refusal(host, f"{python} cannot import unirank: {facts['unirank_error']}")
    if facts.get("torch") is None:
        return Refusal(host, f"{python} has no torch")
    for name in ("unirank", "torch"):
        if facts.get(name) != local[name]:
            return Refusal(host, f"has {name} {facts.get(name)}, this host {local[name]} "
                           "(install the same versions everywhere)")
    port = facts.get("port")
    return HostFacts(host, str(facts["python"]), str(facts["unirank"]), str(facts["torch"]),
                     int(port) if port is not None else None)


def check_hosts(hosts: Sequence[str], options: Sequence[str], cwd: str, python: str,
                pythonpath: str | None, local: Mapping[str, str | None], *,
                connect_timeout: int = DEFAULT_CONNECT_TIMEOUT) -> list[HostFacts | Refusal]:
    """Check every host at once; the first host also picks a free port. Never waits longer
    than ``connect_timeout`` + :data:`CHECK_SLACK_S`."""
    procs = []
    for index, host in enumerate(hosts):
        line = probe_line(cwd, python, pythonpath, port=index == 0)
        procs.append(subprocess.Popen(
            ssh_command(host, options, line, connect_timeout=connect_timeout),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True))
    deadline = time.monotonic() + connect_timeout + CHECK_SLACK_S
    results: list[HostFacts | Refusal] = []
    for host, proc in zip(hosts, procs):
        try:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            results.append(Refusal(host, f"did not answer its check within "
                                   f"{connect_timeout + CHECK_SLACK_S:g} s"))
            continue
        results.append(_verdict(host, proc.returncode, out.decode(errors="replace"),
                                err.decode(errors="replace"), cwd, python, local))
    return results


def ssh_hostname(host: str, options: Sequence[str]) -> str:
    """The address ssh connects to for ``host`` (``ssh -G``: the user's ssh config applied,
    no connection made); ``host`` without its ``user@`` where ssh cannot say."""
    bare = host.rpartition("@")[2]
    try:
        done = subprocess.run(["ssh", *options, "-G", "--", host], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return bare
    for line in done.stdout.decode(errors="replace").splitlines():
        key, _sep, value = line.partition(" ")
        if key == "hostname" and value.strip():
            return value.strip()
    return bare
