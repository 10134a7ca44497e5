"""One node's run, attempt after attempt: :func:`run_plan`, behind ``unirank run`` and
:class:`~unirank.runtime.parallel.Parallel`.

Runs in the ``unirank run`` parent (never imports torch). For one plan it

* opens the store's port where rank 0 runs, once its master address is known to be this host's
  (:func:`unirank.resolve.require_own`), and keeps it open across attempts;
* gives the node's fork server the environment its workers have in common, or starts every
  worker as its own interpreter when the server cannot serve (saying why once);
* makes the run's folder, ``<log_dir>/<run_id>_<random>``, a new one each run, so that no run
  deletes an earlier run's logs (a temporary one, removed at the end, unless some stream goes
  to a log file or a hang report was written; a SIGKILLed run's is swept by a later run:
  :mod:`unirank.sweep`; every path: :mod:`unirank.runfolder`), and in it torchrun's
  ``attempt_<n>/<local_rank>/`` with each
  worker's ``error.json``, its ``fault.txt`` (the Python stack of a fatal signal, written by
  the worker's faulthandler: :mod:`.worker.faults`) and its ``--redirects`` / ``--tee`` log files
  (:func:`attempt_launches`), and the attempt's ``filtered_stdout.log`` / ``filtered_stderr.log``
  (``--duplicate-std*-filters``);
* runs one attempt with the engine (:class:`~unirank.supervisor.engine.Supervisor`) and, with
  ``max_restarts``, starts the group again after a failure, TORCHELASTIC_RESTART_COUNT counting
  the restarts spent (nodes joining spend none: :mod:`.budget`), and the workers of each
  restart learn why the attempt before ended
  (UNIRANK_RESTART_REASON: :func:`.restartreason.restart_reason`); every attempt's root cause
  goes into the summary. A group that stopped to be requeued
  (exit code :data:`~unirank.exitcodes.REQUEUE`) is restarted too, except under
  Slurm, where 79 is passed on for the batch script to requeue the job; a stop signal ends the
  run whatever is left of ``max_restarts``;
* prints what rank 0 gathered at the end of the run (``timeline.json`` in the attempt's
  folder): the start-up timeline (``--timeline``; and writes its JSON) and, where the hang
  watcher measured it over a long enough run, each rank's time in collectives and the ranks
  that kept the others waiting (:func:`unirank.hang.straggle.render_block`).

Reads (from the ``environ`` it is given, never from ``os.environ``): SLURM_JOB_ID, SLURM_JOBID.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from unirank.contract import (
    on_hang_now,
    resolve_hang,
)
from unirank.elasticstate import RestartReason
from unirank.errors import ConfigError
from unirank.exitcodes import HANG_TIMEOUT
from unirank.exitcodes import REQUEUE as REQUEUE_EXIT_CODE
from unirank.launchers import slurm_vars
from unirank.owner import KEEP_DAYS
from unirank.resolve import require_own
from unirank.runfolder import (
    AttemptFolder,
    RunFolder,
    end_run_folder,
    make_run_folder,
    write_evicted,
)
from unirank.runfolder import make_temporary_run_folder as temporary_run_folder
from unirank.statekeep.memory import (
    flush_to_disk,
    make_memory_folder,
    memory_root,
    remove_memory_folder,
)
from unirank.supervisor.budget import is_last, restarting_words, spends_restart
from unirank.supervisor.engineoptions import EngineOptions
from unirank.supervisor.fork.client import ForkServer, fallback_line
from unirank.supervisor.launching import (
    attempt_launches,
    configure_server,
)
from unirank.supervisor.listen import open_store_socket
from unirank.supervisor.plan import Plan
from unirank.supervisor.rdzv.messages import JOIN
from unirank.supervisor.recovery import NextRound, Recovery, format_recovery, restart_line_waits
from unirank.supervisor.restartreason import (
    evicted_node_ranks,
    evicted_why,
    is_slow,
    nothing_to_evict,
    restart_reason,
)
from unirank.supervisor.stopreport import StopReportSpec
from unirank.supervisor.summary import RunResult, exit_code_of

if TYPE_CHECKING:
    from unirank.supervisor.engine import WorldWatch

__all__ = ["EngineOptions", "attempt_launches", "run_plan"]  # attempt_launches: .launching



def run_plan(
    plan: Plan,
    target: Sequence[str],
    *,
    environ: Mapping[str, str],
    options: EngineOptions | None = None,
    out_fd: int = 1,
    err_fd: int = 2,
    server: ForkServer | None = None,
    keep_server: bool = False,
    listening: socket.socket | None = None,
    replan: Callable[[int, Mapping[str, Any] | None], NextRound] | None = None,
    watch: WorldWatch | None = None,
) -> RunResult:
    """Open the store's port (where rank 0 runs, once its master address is known to be this
    host's: :func:`unirank.resolve.require_own`), start this node's workers and supervise
    them, restarting the group up to ``plan.max_restarts`` times after a failure (forked
    again from the same server).

    ``target`` is what follows the bootstrap on the worker's command line (see
    :func:`~unirank.supervisor.engine.worker_command`); ``environ`` the base of every worker's
    environment (see :func:`~unirank.supervisor.workerenv.worker_environ`); ``server`` the
    node's fork server (:func:`~unirank.supervisor.fork.client.start_server`; None: every
    worker starts as its own interpreter), which this function configures and closes (unless
    ``keep_server``: the caller runs it again, as ``ur.launch`` does in a notebook; a server
    already configured by an earlier run keeps the environment it imported with);
    ``listening`` the store's socket where the caller opened it already (the dynamic
    rendezvous publishes its port before the plan exists), which this function closes;
    ``replan`` gives the plan of each restart (its attempt number, and the hang verdict of
    ``--on-hang evict`` where rank 0 here wrote one; the dynamic rendezvous's next round: the
    world may have changed), else every attempt runs ``plan``; ``watch``
    says when the world changed during an attempt (the engine then stops the workers).
    """
    options = options or EngineOptions()
    # workers on a terminal print unbuffered, though through a pipe (see supervisor.output)
    options = replace(options, output=replace(options.output, console_tty=os.isatty(out_fd)))
    sock = listening
    try:
        if plan.hosts_store:  # rank 0 serves here: the master address must be this host's
            require_own(plan.master_addr, source=plan.master_source or "MASTER_ADDR",
                        environ=environ)
            if sock is None:
                sock = open_store_socket(plan.master_port, host=plan.master_addr,
                                         option="MASTER_PORT")
            plan = plan.with_port(int(sock.getsockname()[1]))
        if server is not None:
            configure_server(server, plan, environ, options)
        # imported once the fork server has the environment it imports with, while it imports
        from unirank.supervisor.engine import worker_command

        if server is not None and _cannot_serve(server, options, err_fd):
            server = None
        return _run_attempts(plan, worker_command(target), environ, options, sock, server,
                             (out_fd, err_fd), replan, watch)
    finally:
        if sock is not None:
            sock.close()
        if server is not None and not keep_server:
            server.close()


def _stop_report(plan: Plan, options: EngineOptions, environ: Mapping[str, str],
                 attempt_dir: str) -> StopReportSpec | None:
    """Where the engine asks for the hang report at a stop signal: on the node that runs
    rank 0, with the detector on, not under Slurm (see :mod:`.stopreport`)."""
    settings = options.hang or resolve_hang(None, None, environ)
    if not plan.hosts_store or settings.report_after is None or slurm_vars.in_job(environ):
        return None
    return StopReportSpec(plan.master_addr, plan.master_port, plan.world_size,
                          settings.interval, AttemptFolder(attempt_dir).waiting_mark,
                          environ=environ)


def _cannot_serve(server: ForkServer, options: EngineOptions, err_fd: int) -> bool:
    """Wait until the fork server imported; True (having said why, and closed it) when it
    cannot serve."""
    why = server.wait_ready()
    if why is not None:
        os.write(err_fd, f"{options.prog}: {fallback_line(why)}\n".encode())
    return why is not None


def _run_attempts(plan: Plan, argv: tuple[str, ...], environ: Mapping[str, str],
                  options: EngineOptions, sock: socket.socket | None,
                  server: ForkServer | None, fds: tuple[int, int],
                  replan: Callable[[int, Mapping[str, Any] | None], NextRound] | None = None,
                  watch: WorldWatch | None = None) -> RunResult:
    """Run the workers, restarting them after a failure up to ``plan.max_restarts`` times
    (each restart at ``replan``'s plan, where given); nodes joining (the ``watch``'s news)
    restart them without spending one (:mod:`.budget`)."""
    from unirank.supervisor.engine import Supervisor

    out_fd, err_fd = fds
    shm = memory_root(environ)
    root, keep = _log_root(plan, options, err_fd, shm)
    if watch is not None:  # the spares and the slow link: the detector, top, elastic_state
        watch.keep_at(root)
    memory = make_memory_folder(environ)  # the snapshots outlive the attempts, not the run
    earlier: list[RunResult] = []
    reason: str | None = None
    recovery: Recovery | None = None
    try:
        attempt = spent = 0  # the attempt's folder; the restarts spent (:mod:`.budget`)
        while True:
            attempt_dir = root.attempt(attempt).path  # a new run's folder: nothing to delete
            launches = attempt_launches(plan, argv, environ, options, spent, attempt_dir,
                                        sock.fileno() if sock else None, keep,
                                        restart_reason=reason, state_memory=memory)
            result = Supervisor(
                launches, node_name=plan.node_name, grace_period=options.grace_period,
                signals=options.signals, out_fd=out_fd, err_fd=err_fd, prog=options.prog,
                server=server, slurm_kills=slurm_vars.in_job(environ), watch=watch,
                dstate_timeout=options.dstate_timeout,
                stop_report=_stop_report(plan, options, environ, attempt_dir),
                fold_file=root.attempt(attempt).folded_file,
            ).run()
            stopped = time.time()
            asked = _read_text(AttemptFolder(attempt_dir).on_hang_asked)
            on_hang = on_hang_now(options.on_hang, asked)
            # every rank writes the hang's verdict here at the hang timeout (the attempt may
            # still have ended as a world change: the stuck node asked for a new round first)
            # (or --on-slow evict's: a straggler's node, :mod:`unirank.hang.slowcost`)
            verdict = _read_verdict(attempt_dir)
            slow = is_slow(verdict)
            verdict = verdict if on_hang == "evict" or slow else None
            if nothing := nothing_to_evict(verdict):
                os.write(err_fd, f"{options.prog}: {nothing}\n".encode())
            joining = watch is not None and watch.kind() == JOIN
            if is_last(result, spent, plan.max_restarts, environ, joining=joining) or nothing or (
                    on_hang == "exit" and _hang_timeout(result) and not slow):
                _report_end(root.attempt(attempt).timeline_file, options, err_fd, recovery)
                return replace(result, attempts=tuple(earlier))
            spends = spends_restart(result, joining=joining)
            restarting = f"; {restarting_words(spent, plan.max_restarts, spends=spends)}\n"
            waits = replan is not None and restart_line_waits(
                "evict" if slow else on_hang, _hang_timeout(result), result.world_changed)
            if not waits:  # else said once the next round took this node (not evicted)
                os.write(err_fd, f"{options.prog}: attempt {attempt} {_attempt_end(result)}"
                         f"{restarting}".encode())
            if evicted := evicted_node_ranks(verdict, plan.ranks_per_node):  # unirank top's
                write_evicted(root.evicted_file, attempt, evicted, evicted_why(verdict))
            attempt += 1
            spent += spends
            before, news, moved = plan, None, None
            if replan is not None:
                began = time.time()
                plan, line, noticed, moved = _next_plan(replan, attempt, sock, verdict)
                news = None if noticed is None else began - noticed
            why = restart_reason(result, before, plan, evicted_why(verdict), moved)
            if replan is not None:
                said = f"{options.prog}: attempt {attempt - 1} " \
                    f"{_attempt_end(result, why)}{restarting}" if waits else ""
                os.write(err_fd, said.encode() + line)
            earlier.append(replace(result, nodes_changed=why.headline()))
            recovery = Recovery(why.headline() or why.describe(), attempt,
                                news if news is not None else stopped, stopped,
                                time.time() if replan is not None else None)
            reason = why.to_value(spent, before.world_size)
    finally:
        kept = flush_to_disk(memory)  # a stop (or any end) loses no step the disk lacks
        if kept:
            os.write(err_fd, f"{options.prog}: {kept}\n".encode())
        remove_memory_folder(memory)
        # a temporary folder in which a hang report was written (which a report named), or
        # worker lines kept off the console (a line named the file), is kept
        if end_run_folder(root, temporary=not keep, shm=shm):
            os.write(err_fd, f"{options.prog}: hang reports kept in {root.path} (removed by "
                     f"a later run {KEEP_DAYS:g} days after this one)\n".encode())


def _hang_timeout(result: RunResult) -> bool:
    """Whether ``--hang-timeout`` ended the attempt (its root cause exited with 86)."""
    first = result.first_failure
    return first is not None and first.own_exit_code == HANG_TIMEOUT


def _read_text(path: str) -> str | None:
    """A small file of the attempt's folder (the program's ``on_hang=``), None where absent."""
    with contextlib.suppress(OSError, ValueError), open(path, encoding="utf-8") as fh:
        return fh.read(64)
    return None


def _read_verdict(attempt_dir: str) -> Mapping[str, Any] | None:
    """The hang verdict rank 0 wrote in the attempt's folder (here only where rank 0 ran)."""
    with contextlib.suppress(OSError, ValueError):
        with open(AttemptFolder(attempt_dir).hang_verdict, encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else None
    return None


def _next_plan(replan: Callable[[int, Mapping[str, Any] | None], NextRound], attempt: int,
               sock: socket.socket | None, verdict: Mapping[str, Any] | None = None,
               ) -> tuple[Plan, bytes, float | None, str | None]:
    """The plan of restart ``attempt``, its port the store socket's where rank 0 runs here;
    the round's line to say; seconds from the news to the rendezvous (None: no news); the
    news that the rendezvous moved."""
    nxt = replan(attempt, verdict)
    plan = nxt.plan
    if plan.hosts_store:
        if sock is None:
            raise ConfigError("rank 0 moved to this node, which serves no store",
                              hint="start the job again")
        plan = plan.with_port(int(sock.getsockname()[1]))
    line = (nxt.line + "\n").encode() if nxt.line else b""
    return plan, line, nxt.noticed, nxt.moved


def _attempt_end(result: RunResult, why: RestartReason | None = None) -> str:
    """How an attempt that is restarted ended, for the restart's line; ``why``: its restart
    reason, once the next round is known: where nodes were evicted, that is how it ended (not
    a failure of the rank that waited for them at the hang timeout)."""
    if why is not None and why.kind == "node evicted":
        return f"stopped ({why.message})"
    if result.requeued:
        return f"stopped to be requeued (exit code {REQUEUE_EXIT_CODE})"
    if result.first_failure is None and result.world_changed:
        return f"stopped ({result.world_changed})"
    first = result.first_failure
    cause = (f"rank {first.rank}: {first.describe()}"
             if first else f"exit code {exit_code_of(result.exit_code)}")
    return f"failed ({cause})"


def _log_root(plan: Plan, options: EngineOptions, err_fd: int,
              shm: str) -> tuple[RunFolder, bool]:
    """The run's folder (a new ``<log_dir>/<run_id>_<random>``, or a temporary one, made once
    what killed runs left there and in ``shm`` is swept) and whether to keep it afterwards;
    where some stream goes to a file, one line names it."""
    out = options.output
    if out.log_dir:
        try:
            root = make_run_folder(out.log_dir, plan.run_id)
        except OSError as exc:
            raise ConfigError(f"cannot make the run's folder there: {exc.strerror}",
                              variable="--log-dir", value=out.log_dir,
                              hint="give a folder this user can write") from None
    else:
        root = temporary_run_folder(shm)
    if out.writes_files:
        os.write(err_fd, f"{options.prog}: log files in {root.path}\n".encode())
    return root, bool(out.log_dir) or out.writes_files


def _report_end(path: str, options: EngineOptions, err_fd: int,
                recovery: Recovery | None = None) -> None:
    """Print what rank 0 gathered at the run's end (where rank 0 ran): the start-up timeline
    (``--timeline``; and write its JSON) and the last ``recovery``'s phases, then the time in
    collectives and the stragglers."""
    from unirank.hang.straggle import render_block
    from unirank.supervisor.worker.timeline import format_table

    try:
        with open(path, encoding="utf-8") as fh:
            records = json.load(fh)
    except (OSError, ValueError):
        return  # rank 0 runs elsewhere, or did not finish: its node prints them
    if options.timeline:
        os.write(err_fd, format_table(records).encode())
        if recovery is not None:
            os.write(err_fd, format_recovery(recovery, records).encode())
    block = render_block(records, options.prog)
    if block:
        os.write(err_fd, block.encode())
    if options.timeline_json:
        with open(options.timeline_json, "w", encoding="utf-8") as fh:
            json.dump(records, fh, indent=1)

