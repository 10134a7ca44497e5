"""``unirank doctor --hosts node1,node2`` (or ``--hostfile``): the doctor across hosts over ssh.

First every host's ssh check of ``unirank run --hosts`` (:mod:`unirank.supervisor.ssh.preflight`:
reachable within ConnectTimeout, same folder and interpreter, unirank and torch versions) as
one row per host; then, when they pass, ``unirank run --hosts H1:1,H2:1,... -m unirank doctor``:
one rank per host, whose group check joins a gloo group served by the first host, so the
master's reachability from every host is checked by the real thing; rank 0 prints its table.

Reads (from the mapping it is given): ``PYTHONPATH`` (carried to the hosts).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence

from unirank.doctor.result import FAIL, OK, Check, emit, failed
from unirank.supervisor.ssh.preflight import HostFacts, Refusal
from unirank.words import counted

__all__ = ["add_host_arguments", "host_rows", "main_hosts"]


def add_host_arguments(parser: argparse.ArgumentParser) -> None:
    """``--hosts``, ``--hostfile``, ``--ssh-option`` (as ``unirank run``'s)."""
    parser.add_argument("--hosts", default=None, metavar="HOST,...",
                        help="check these hosts over ssh, then one rank on each as a group "
                        "(docs/ssh.md)")
    parser.add_argument("--hostfile", default=None, metavar="FILE",
                        help="the hosts, one a line ('host slots=N' or 'host:N')")
    parser.add_argument("--ssh-option", "--ssh_option", dest="ssh_option", action="append",
                        default=[], metavar="OPT", help="an ssh option (as unirank run's)")
    parser.set_defaults(include=None, exclude=None)


def host_rows(results: Sequence[HostFacts | Refusal]) -> list[Check]:
    """One row per host: its versions, or why it cannot run the job."""
    rows = []
    for result in results:
        if isinstance(result, HostFacts):
            rows.append(Check(f"ssh {result.host}", OK, f"python {result.python}, unirank "
                              f"{result.unirank}, torch {result.torch}"))
        else:
            rows.append(Check(f"ssh {result.host}", FAIL, result.reason,
                              "fix the host, or leave it out with --exclude"))
    return rows


def main_hosts(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """The hosts' rows; then, when none failed, the group check across them."""
    from unirank.cli.sshrun import hosts_of
    from unirank.supervisor.ssh.preflight import check_hosts, local_versions
    from unirank.supervisor.ssh.remote import ssh_options

    names = [name for name, _ in hosts_of(args)]
    results = check_hosts(names, ssh_options(args.ssh_option), os.getcwd(), sys.executable,
                          environ.get("PYTHONPATH"), local_versions(platform.python_version()))
    rows = host_rows(results)
    code = emit(rows, [f"unirank doctor: {counted(len(names), 'host')} over ssh"], args.json)
    if failed(rows):
        return code
    command = [sys.executable, "-m", "unirank", "run", "--hosts",
               ",".join(f"{name}:1" for name in names)]
    for option in args.ssh_option:
        command += ["--ssh-option", option]
    command += ["-m", "unirank", "doctor", "--backend", args.backend,
                "--timeout", f"{args.timeout:g}", *(["--json"] if args.json else [])]
    return subprocess.run(command, env=dict(environ), check=False).returncode
