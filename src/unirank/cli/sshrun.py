"""``unirank run --hosts node1:4,node2:4`` / ``--hostfile FILE``: one ``unirank run`` per host over
ssh (docs/ssh.md).

This process plans the job (node ``i`` of the list is node rank ``i``; the first host serves the
store), checks every host in parallel (:mod:`unirank.supervisor.ssh.preflight`), then starts
``cd CWD && exec PYTHON -m unirank run --from-ssh --nnodes N --node-rank i --master-addr A
--master-port P [--nproc-per-node S] [the user's options] SCRIPT ARGS`` on each host through
OpenSSH's client and supervises them (:mod:`unirank.supervisor.ssh.fanout`).

Reads (from the mapping it is given): the carried variables of
:mod:`unirank.supervisor.ssh.remote` (``NCCL_*``, ``GLOO_*``, ``TORCH_*``, ``CUDA_*``,
``PYTHONPATH``, ``OMP_NUM_THREADS``, ``UNIRANK_INIT_TIMEOUT``, ``UNIRANK_NO_PRELOAD``,
``UNIRANK_STOP_SIGNALS``, ``UNIRANK_RDZV_SECRET``, ``UNIRANK_RDZV_SECRET_FILE``), the ``-x``
names, and TORCH_ELASTIC_SHUTDOWN_TIMEOUT (the grace period,
:func:`unirank.cli.runconfig.grace_period`). An elastic host list without a rendezvous secret
gets a fresh one, sent to every host with the carried variables (over ssh's stdin, never on its
command line).
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from unirank.contract import RDZV_SECRET_FILE_VAR, RDZV_SECRET_VAR
from unirank.errors import ConfigError
from unirank.exitcodes import USAGE

__all__ = ["SSH_OPTIONS", "add_ssh_arguments", "check_ssh_only", "hosts_of", "main_hosts",
           "relaunch_argv"]

#: the options that belong to this launcher and never reach a host's unirank run
SSH_OPTIONS = ("--hosts", "--hostfile", "--include", "--exclude", "--ssh-option",
               "--ssh_option", "-x")


def add_ssh_arguments(parser: argparse.ArgumentParser) -> None:
    """``unirank run``'s options for starting hosts over ssh."""
    group = parser.add_argument_group("hosts over ssh (docs/ssh.md)")
    group.add_argument("--hosts", default=None, metavar="HOST[:N],...",
                       help="start one unirank run per host over ssh, N workers each "
                       "(node rank = position; the first host serves the store)")
    group.add_argument("--hostfile", default=None, metavar="FILE",
                       help="the hosts, one a line: 'host slots=N' (DeepSpeed, Open MPI) or "
                       "'host:N'; # comments")
    group.add_argument("--include", default=None, metavar="H1@H2",
                       help="only these hosts of the list (DeepSpeed's form)")
    group.add_argument("--exclude", default=None, metavar="H1@H2",
                       help="all hosts of the list but these")
    group.add_argument("--ssh-option", "--ssh_option", dest="ssh_option", action="append",
                       default=[], metavar="OPT",
                       help="an ssh option: Port=2222 (as -o) or '-F ./ssh_config'; repeatable")
    group.add_argument("-x", dest="export", action="append", default=[], metavar="NAME[=V]",
                       help="also carry this variable (NAME, or NAME=VALUE) to every host (as "
                       "mpirun's -x); repeatable")
    group.add_argument("--from-ssh", dest="from_ssh", action="store_true",
                       help=argparse.SUPPRESS)


def relaunch_argv(added: Sequence[str], raw: Sequence[str],
                  python: str = sys.executable) -> list[str]:
    """``unirank run`` started again elsewhere (an srun step, an ssh host) by the same
    interpreter: ``added`` options first, then the user's own arguments ``raw``."""
    return [python, "-m", "unirank", "run", *added, *raw]


def hosts_of(args: argparse.Namespace) -> list[tuple[str, int | None]]:
    """The hosts of ``--hosts`` or ``--hostfile`` after ``--include``/``--exclude``: (name,
    slots) pairs in order."""
    from unirank.supervisor.ssh.hosts import parse_hostfile, parse_hosts, select_hosts

    if args.hosts and args.hostfile:
        raise ConfigError("cannot be combined with --hostfile", variable="--hosts",
                          value=args.hosts, hint="give the hosts one way")
    if args.hostfile:
        try:
            text = Path(args.hostfile).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot be read: {exc.strerror}", variable="--hostfile",
                              value=args.hostfile, hint="give an existing hostfile") from None
        hosts = parse_hostfile(text, args.hostfile)
    else:
        hosts = parse_hosts(args.hosts)
    return [(h.name, h.slots) for h in select_hosts(hosts, args.include, args.exclude)]


def check_ssh_only(args: argparse.Namespace) -> None:
    """The ssh options without --hosts/--hostfile, and --hosts with options it sets."""
    if not (args.hosts or args.hostfile):
        for name, value in (("--include", args.include), ("--exclude", args.exclude),
                            ("--ssh-option", args.ssh_option), ("-x", args.export)):
            if value:
                shown = value if isinstance(value, str) else " ".join(value)
                raise ConfigError("only applies with --hosts or --hostfile", variable=name,
                                  value=shown, hint="add --hosts node1:N,node2:N")
        return
    nnodes = None if elastic(args) else args.nnodes
    for name, value in (("--nnodes", nnodes), ("--node-rank", args.node_rank),
                        ("--standalone", args.standalone or None)):
        if value is not None:
            raise ConfigError("is set by the host list", variable=name, value=str(value),
                              hint=f"drop {name}: each host is one node, in list order (or "
                              "give a range MIN:MAX for an elastic job)" if name == "--nnodes"
                              else f"drop {name}: each host is one node, in list order")


def elastic(args: argparse.Namespace) -> bool:
    """Whether a host list runs as an elastic job: ``--nnodes MIN:MAX``, a range
    (:func:`unirank.cli.elastic.is_range`)."""
    from unirank.cli.elastic import is_range

    return is_range(args)


def _nproc(args: argparse.Namespace, slots: Sequence[int | None]) -> int | None:
    from unirank.supervisor.ssh.hosts import Host, common_slots

    if args.nproc_per_node is not None:
        return None  # the user's own option goes through as it is
    return common_slots([Host(str(i), s) for i, s in enumerate(slots)])


def main_hosts(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """Check every host, then run the job on all of them; the exit code."""
    from unirank.supervisor.ssh.preflight import HostFacts, check_hosts, local_versions
    from unirank.supervisor.ssh.remote import carried_environ, ssh_options

    check_ssh_only(args)
    hosts = hosts_of(args)
    nproc = _nproc(args, [slots for _, slots in hosts])
    carried = carried_environ(environ, args.export)
    if elastic(args) and not (carried.get(RDZV_SECRET_VAR) or carried.get(RDZV_SECRET_FILE_VAR)):
        carried[RDZV_SECRET_VAR] = secrets.token_hex(32)  # the job's own, sent over stdin
    options = ssh_options(args.ssh_option)
    cwd = os.getcwd()
    names = [name for name, _ in hosts]
    results = check_hosts(names, options, cwd, sys.executable, carried.get("PYTHONPATH"),
                          local_versions(platform.python_version()))
    refused = [r for r in results if not isinstance(r, HostFacts)]
    for refusal in refused:
        print(f"unirank run: error: {refusal.line()}", file=sys.stderr, flush=True)
    if refused:
        return USAGE
    first = results[0]
    assert isinstance(first, HostFacts)
    from unirank.cli.runconfig import grace_period

    grace = grace_period(args.grace_period, environ)
    return _run(args, names, options, carried, nproc, first.port, cwd, grace)


def _run(args: argparse.Namespace, names: Sequence[str], options: Sequence[str],
         carried: Mapping[str, str], nproc: int | None, port: int | None, cwd: str,
         grace: float) -> int:
    from unirank.contract import NODE_NAME_VAR
    from unirank.supervisor.ssh.fanout import HostRun, run_hosts
    from unirank.supervisor.ssh.preflight import ssh_hostname
    from unirank.supervisor.ssh.remote import encode_environ, remote_line, ssh_command

    common = ["--from-ssh"] if elastic(args) else ["--from-ssh", "--nnodes", str(len(names))]
    if elastic(args):
        common += _elastic_options(args, ssh_hostname(names[0], options), port)
    else:
        if not (args.master_addr or args.rdzv_endpoint):
            common += ["--master-addr", ssh_hostname(names[0], options)]
        if not (args.master_port or args.rdzv_endpoint) and port is not None:
            common += ["--master-port", str(port)]
    if nproc is not None:
        common += ["--nproc-per-node", str(nproc)]
    raw = _user_arguments(args)
    runs = []
    for rank, host in enumerate(names):
        own = ["--local-addr", ssh_hostname(host, options)] if elastic(args) \
            else ["--node-rank", str(rank)]
        argv = relaunch_argv([*common, *own], raw)
        # the host as the list names it: the node name of its ranks in summaries
        first_line = encode_environ({**carried, NODE_NAME_VAR: host})
        runs.append(HostRun(host, rank, tuple(ssh_command(host, options,
                                                          remote_line(cwd, argv, carried))),
                            first_line))
    return run_hosts(runs, grace, elastic=elastic(args))


def _elastic_options(args: argparse.Namespace, first: str, port: int | None) -> list[str]:
    """An elastic host list's rendezvous: c10d at the first host (the free port the check
    found there) unless given; each host is then a node of the dynamic rendezvous (its
    ``--local-addr`` its address), and the job survives a lost host (docs/ssh.md)."""
    added = [] if str(args.rdzv_backend).strip().lower() == "c10d" \
        else ["--rdzv-backend", "c10d"]
    if not args.rdzv_endpoint:
        added += ["--rdzv-endpoint", f"{first}:{port or 29400}"]
    return added


def _user_arguments(args: argparse.Namespace) -> list[str]:
    """The user's ``unirank run`` arguments without this launcher's own options."""
    from unirank.supervisor.ssh.remote import strip_options

    raw = list(getattr(args, "raw_argv", None) or [])
    return strip_options(raw, SSH_OPTIONS, getattr(args, "value_options", ()))
