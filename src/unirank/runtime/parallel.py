"""``with Parallel(...) as p: p.run(fn, *args)``: one script, serial, launched or self-spawning.

:class:`Parallel` asks the one planner (:func:`unirank.supervisor.plan.make_plan`) what to do,
with the same rules as ``unirank run``:

* in place, world of one -- no launcher, no ``nproc_per_node``: ``fn(0, ...)`` runs here; a
  process group of one is started only when a backend was asked for explicitly;
* in place -- a launcher (torchrun, srun, mpirun...) started this process as one rank: it
  initialises the process group and runs ``fn(local_rank, ...)``;
* spawn -- ``nproc_per_node`` given and no launcher already placed several processes on this
  node: this process starts ``nproc_per_node`` workers through the one process engine
  (:func:`unirank.supervisor.attempts.run_plan`, as ``unirank run``): ``fn`` and its arguments are
  pickled as a :class:`~unirank.runtime.worker.Call` to each worker's bootstrap, which sets up
  ``__main__`` as multiprocessing's ``spawn`` does and runs it
  (:func:`~unirank.runtime.worker.run_call`: initialise the process group, call
  ``fn(local_rank, ...)``, finalize). Workers get torchrun's full environment; a failure stops
  the others and prints the same root-cause summary as ``unirank run``, then
  :class:`WorkerFailedError` is raised here. A :class:`~unirank.errors.ConfigError` in the
  workers (a launch or usage mistake) is raised here again instead, as its one line, with no
  summary and no worker traceback, as it would be serially;
  ``fn`` defined in a notebook cell or at the ``python`` prompt goes by value (cloudpickle:
  :mod:`~unirank.runtime.byvalue`). The workers' output reaches this process's ``sys.stdout``
  and ``sys.stderr`` in whole lines, through a relay where those are not files (a Jupyter
  kernel's streams: :mod:`~unirank.runtime.relay`). ``run`` returns what ``fn`` returned on
  each of this node's workers, by local rank; an exception in a worker is raised here as
  :class:`WorkerFailedError` with that rank's traceback as its cause (:class:`RankTraceback`);
* a backend's own launcher -- a backend that brings one (``xla-tpu``: torch_xla's
  ``xmp.spawn``), named explicitly, with ``nproc_per_node`` and no launcher around: that
  launcher starts the workers, and each initialises the backend and calls ``fn(local_rank, ...)``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import logging
import os
import re
import shutil
import signal
import sys
from collections.abc import Callable
from dataclasses import replace
from types import TracebackType
from typing import Any

from unirank.contract import HANG_KEYWORDS, resolve_hang, resolve_init_timeout, resolve_on_hang
from unirank.errors import ConfigError
from unirank.runtime import backends, ignite_options, lifecycle, state
from unirank.runtime.helpers import ignite_logger
from unirank.runtime.relay import ConsoleRelay
from unirank.runtime.worker import (
    Call,
    read_results,
    refuse_launch_while_importing_main,
    run_call,
    write_call,
)
from unirank.supervisor.plan import IN_PLACE, LaunchRequest, Plan, make_plan

__all__ = ["LOGGER_NAME", "Parallel", "RankTraceback", "WorkerFailedError", "check_request"]

#: how the summary of a failed spawn names its author
PROG = "unirank Parallel"


class RankTraceback(Exception):
    """The traceback a failed worker printed, as the ``__cause__`` of its
    :class:`WorkerFailedError` (so that a notebook or the ``python`` prompt shows it)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n" + self.text


class WorkerFailedError(RuntimeError):
    """A spawned worker failed; the root cause (see :mod:`unirank.supervisor.engine`) is named.

    ``exitcode`` is the worker's exit code, or minus the signal that killed it; ``traceback``
    the last traceback it printed ("" when none). (Workers stopped by a SIGTERM this process
    got and forwarded raise no such error: the script ends with 128 + N for signal N.)
    """

    def __init__(self, local_rank: int, rank: int, exitcode: int, last_line: str = "",
                 traceback: str = "") -> None:
        self.local_rank = local_rank
        self.rank = rank
        self.exitcode = exitcode
        self.traceback_tail = last_line
        self.traceback = traceback
        if exitcode < 0:
            try:
                how = f"was killed by signal {signal.Signals(-exitcode).name}"
            except ValueError:
                how = f"was killed by signal {-exitcode}"
        else:
            how = f"exited with code {exitcode}"
        message = f"local rank {local_rank} (rank {rank}) {how}"
        if last_line:
            message += f": {last_line}"
        super().__init__(message)


#: the logger ``Parallel`` writes ignite's lines to (ignite's name for it)
LOGGER_NAME = "ignite.distributed.launcher.Parallel"


def quiet_launcher_log() -> None:
    """Keep ``Parallel``'s INFO lines (ignite's ``Spawn function ...``, ``End of run``) off
    stderr: for unirank's own commands, whose output is their report."""
    logging.getLogger(LOGGER_NAME).setLevel(logging.WARNING)


def _refuse(variable: str, value: Any, message: str, hint: str) -> ConfigError:
    return ConfigError(message, variable=variable, value=str(value), hint=hint)


def check_request(backend: str | None, request: dict[str, Any], init_method: str | None) -> None:
    """ignite's checks of ``Parallel``'s arguments, made when the object is built: a known
    backend that can run here (``nccl`` needs CUDA); without one, no spawn argument; no
    ``tcp://`` init method; with ``nproc_per_node``: positive counts, ``node_rank`` within
    ``nnodes``, and a master address and port (or an ``init_method``) for more than one node.
    Each is a one-line :class:`~unirank.errors.ConfigError` (a ValueError, as ignite raises),
    in ignite's words where unirank had none of its own."""
    if backend is not None:
        if backend.strip().lower() != backends.AUTO and backends.find(backend) is None:
            try:
                backends.get(backend)
            except ConfigError as exc:
                known = (backends.AUTO, *backends.names(), *backends.TORCH_BACKENDS)
                raise _refuse("backend", backend, f"is not a torch.distributed backend (Unknown "
                              f"backend '{backend}'. Available backends: {known})",
                              str(exc.hint)) from None
        backends.choose_backend(backend, backends.cuda_facts())  # one that cannot run here
    else:
        for name, value in request.items():
            if value is not None:
                raise _refuse(name, value, f"If backend is None, argument '{name}' should be "
                              f"also None, but given {value}",
                              "name a backend (\"auto\" picks one) to spawn workers")
    ignite_options.init_method(init_method)
    nproc = request["nproc_per_node"]
    if backend is None or nproc is None:
        return
    nnodes, node_rank = request["nnodes"] or 1, request["node_rank"]
    for name, count in (("nproc_per_node", nproc), ("nnodes", nnodes)):
        if count < 1:
            raise _refuse(name, count, "must be an integer >= 1",
                          f"pass {name}=<integer >= 1>")
    if node_rank is None and nnodes > 1:
        raise _refuse("node_rank", None, "If number of nodes larger than one, arguments "
                      "node_rank should be given", "give each node its node_rank")
    if not 0 <= (node_rank or 0) < nnodes:
        raise _refuse("node_rank", node_rank, f"Argument node_rank should be between 0 and "
                      f"{nnodes - 1}, but given {node_rank}", "count nodes from 0")
    if nnodes > 1 and init_method is None and (
            request["master_addr"] is None or request["master_port"] is None):
        raise _refuse("master_addr", request["master_addr"], "If number of nodes larger than "
                      "one, arguments master_addr and master_port or init_method should be "
                      "specified", "pass master_addr and master_port (the address of node 0)")


class Parallel:
    """Context manager that runs ``fn(local_rank, *args, **kwargs)`` on every rank.

    ``backend``: ``None`` (serial, or the group a launcher describes), ``"auto"``, ``"gloo"``,
    ``"nccl"``... ``nproc_per_node``: spawn this many local workers (with a backend);
    ``nnodes``, ``node_rank``, ``master_addr``, ``master_port`` (an int, or a string of one)
    describe a multi-node spawn when no launcher does (see :mod:`unirank.supervisor.plan` for the
    rules). ``init_method``: ``None``/``"env://"`` or ``"file://PATH"``
    (:func:`~unirank.runtime.ignite_options.init_method`). ``init_timeout``: seconds every rank
    waits for the others to join (default ``UNIRANK_INIT_TIMEOUT``, else 300).
    ``tag_output``: spawned workers' lines start with ``[rank<N>]:`` (``unirank run
    --tag-output``). ``keep_server``: the fork server stays, idle, for the next spawn of this
    process (``launch``'s way; it ends with this process). ``hang_report_after``,
    ``hang_timeout`` (keywords only): the hang detector's settings, as ``unirank run
    --hang-report-after/--hang-timeout`` (seconds, or ``"off"``; default the variables
    UNIRANK_HANG_REPORT_AFTER, UNIRANK_HANG_TIMEOUT); ``on_hang`` (keyword only): what follows
    a hang timeout, as ``unirank run --on-hang`` (``"exit"``, ``"restart"``; ``"evict"`` only in
    place, in an elastic job; default UNIRANK_ON_HANG, else ``--on-hang``'s).
    ``spawn_kwargs``: pytorch-ignite's
    options, as :mod:`~unirank.runtime.ignite_options` reads them (``timeout`` is an init
    timeout). Bad arguments are refused here, when the object is built, with ignite's exception
    types (:func:`check_request`). ignite's lines (``Spawn function ... in N processes``, ``End of
    run``...) are logged on rank 0 to the logger ``ignite.distributed.launcher.Parallel``.

    Reads: the launcher's variables (through :func:`~unirank.runtime.state.dist_env`),
    MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE, OMP_NUM_THREADS,
    UNIRANK_INIT_TIMEOUT, UNIRANK_HANG_REPORT_AFTER, UNIRANK_HANG_TIMEOUT,
    UNIRANK_HANG_INTERVAL, UNIRANK_ON_HANG, SLURMD_NODENAME.
    """

    def __init__(
        self,
        backend: str | None = None,
        nproc_per_node: int | None = None,
        nnodes: int | None = None,
        node_rank: int | None = None,
        master_addr: str | None = None,
        master_port: int | str | None = None,
        init_method: str | None = None,
        *,
        init_timeout: float | None = None,
        tag_output: bool = False,
        keep_server: bool = False,
        hang_report_after: str | float | None = None,
        hang_timeout: str | float | None = None,
        on_hang: str | None = None,
        **spawn_kwargs: Any,
    ) -> None:
        refuse_launch_while_importing_main("Parallel")
        request = dict(nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank,
                       master_addr=master_addr, master_port=master_port)
        check_request(backend, request, init_method)
        #: the hang detector's keywords, as given (for ``init`` in place), and their settings
        #: (for spawned workers; None: neither given, the variables say)
        self._hang = (hang_report_after, hang_timeout)
        self._hang_settings = lifecycle.hang_settings(hang_report_after, hang_timeout,
                                                      os.environ)
        #: ``on_hang=``, its word checked now (its error names the keyword): in place it goes
        #: to ``init`` (``evict`` in an elastic job only); spawned workers form a static world
        #: (no ``evict``), where it is the engine's ``--on-hang``
        self._on_hang = on_hang
        if on_hang is not None:
            resolve_on_hang(on_hang, {}, elastic=True, restarts=0, option="on_hang")
        # pytorch-ignite's Parallel options (timeout, start_method, join, daemon)
        ignite = dict(spawn_kwargs)
        ignite_options.take_spawn_options(ignite)
        timeout = ignite_options.take_init_timeout(ignite, "Parallel")
        given, self._timeout_keyword = ignite_options.init_timeout_given(init_timeout, timeout)
        if given is not None:  # refused now, naming the keyword given
            given = resolve_init_timeout(given, {}, option=self._timeout_keyword)
        self.backend = backend
        self.init_method = init_method
        self.init_timeout: float | None = given
        request["master_port"] = None if master_port is None else int(master_port)
        self._request = request
        self._tag_output = tag_output
        self._keep_server = keep_server
        self.plan: Plan | None = None
        self._finalize = False
        #: the backend's own launcher, when it starts the workers (see :meth:`_own_launcher`)
        self._own_spawn: Callable[[int, Callable[[int], None]], None] | None = None
        self._logger = logging.getLogger(LOGGER_NAME)

    def _own_launcher(self, env: Any) -> Callable[[int, Callable[[int], None]], None] | None:
        """The ``spawn`` hook of the backend whose own launcher starts the workers (XLA's
        ``xmp.spawn``): an explicitly named backend with one, ``nproc_per_node`` given, and no
        launcher that already placed several processes."""
        if self.backend is None or self._request["nproc_per_node"] is None:
            return None
        entry = backends.find(self.backend)
        if entry is None or env.world_size > 1:
            return None
        return entry.spawn

    def __enter__(self) -> Parallel:
        env = state.dist_env()
        lifecycle.require_launched(env, sys.argv, sys.executable)
        own_spawn = self._own_launcher(env)
        if own_spawn is not None:
            backends.choose_backend(self.backend, backends.cuda_facts())  # installed at all?
            self._own_spawn = own_spawn
            self._logger = ignite_logger(LOGGER_NAME)
            self._log_start(in_place=False)
            return self
        timeout = resolve_init_timeout(self.init_timeout, os.environ, option=self._timeout_keyword)
        request = LaunchRequest(init_timeout=timeout, spawn_default=None,
                                **self._request)  # type: ignore[arg-type]
        plan = make_plan(request, env, os.environ)
        self.plan = plan
        in_place = plan.mode == IN_PLACE
        wants_group = in_place and (plan.world_size > 1 or self.backend is not None)
        if wants_group and not state.is_initialized():
            lifecycle.init(self.backend, self.init_timeout, self.init_method,
                           hang_report_after=self._hang[0], hang_timeout=self._hang[1],
                           on_hang=self._on_hang)
            self._finalize = True
        elif in_place:
            lifecycle.ask_on_hang(self._on_hang, os.environ)
        self._logger = ignite_logger(LOGGER_NAME)
        self._log_start(in_place)
        return self

    def _log_start(self, in_place: bool) -> None:
        """ignite's lines when the context starts (with a backend only)."""
        if self.backend is None:
            return
        if in_place:
            started = state.backend() or self.backend  # "auto" names the one it chose
            self._logger.info(f"Initialized processing group with backend: '{started}'")
            return
        self._logger.info(f"Initialized distributed launcher with backend: '{self.backend}'")
        params = {"init_method": self.init_method, **self._request}
        lines = "\n\t".join(f"{k}: {v}" for k, v in params.items() if v is not None)
        self._logger.info(f"- Parameters to spawn processes: \n\t{lines}")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._finalize:
            self._finalize = False
            self._logger.info("Finalized processing group with backend: "
                              f"'{state.backend() or self.backend}'")
            lifecycle.finalize()

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``fn(local_rank, *args, **kwargs)`` on every rank (spawning workers if planned)
        and return what it returned: spawned, one value per worker of this node, by local rank
        (one node: by rank); in place, this process's value alone; through a backend's own
        launcher, nothing (an empty list).

        Spawned, ``fn`` and its arguments must be picklable: a module-level function of an
        importable module (in a script, under ``if __name__ == "__main__":``), or one defined
        in a notebook cell or at the ``python`` prompt (sent by value: cloudpickle, the
        ``notebook`` extra); so must its return values.
        """
        if self.plan is None and self._own_spawn is None:
            with self:
                return self.run(fn, *args, **kwargs)
        call = Call(fn, args, kwargs, self.backend, self.init_timeout, self.init_method)
        values: list[Any] = []
        if self._own_spawn is not None:
            nprocs = int(self._request["nproc_per_node"] or 1)
            self._logger.info(f"Spawn function '{fn}' in {nprocs} processes")
            self._own_spawn(nprocs, functools.partial(run_call, call))
        elif self.plan is not None and self.plan.mode == IN_PLACE:
            self._logger.info(f"- Run '{fn}' in {state.get_world_size()} processes")
            # __enter__ started the group
            values = [run_call(call, state.get_local_rank(), start_group=False)]
        elif self.plan is not None:
            spawned = self._request["nproc_per_node"] or self.plan.local_world_size
            self._logger.info(f"Spawn function '{fn}' in {spawned} processes")
            values = self._spawn(self.plan, call)
        self._logger.info("End of run")
        return values

    def _spawn(self, plan: Plan, call: Call) -> list[Any]:
        from unirank.supervisor.attempts import EngineOptions, run_plan
        from unirank.supervisor.output import TAG_TEMPLATE, OutputOptions
        from unirank.sweep import PARALLEL_PREFIX, make_owned_folder

        on_hang = resolve_on_hang(self._on_hang, os.environ, elastic=False,
                                  restarts=plan.max_restarts, option="on_hang")
        folder = make_owned_folder(PARALLEL_PREFIX)  # a killed caller's: swept (unirank.sweep)
        path = os.path.join(folder, "call.pickle")
        options = EngineOptions(prog=PROG, output=OutputOptions(
            prefix_template=TAG_TEMPLATE if self._tag_output else None),
            hang=self._hang_settings or resolve_hang(None, None, os.environ,
                                                     names=HANG_KEYWORDS),
            on_hang=on_hang)
        server = None
        ran = False
        try:
            write_call(replace(call, results=folder), path)
            server = _fork_server(path, keep=self._keep_server, warm=_builds_ddp(path, call.fn))
            with ConsoleRelay(sys.stdout, sys.stderr) as (out_fd, err_fd):
                result = run_plan(plan, ["--call", path], environ=os.environ, options=options,
                                  out_fd=out_fd, err_fd=err_fd, server=server,
                                  keep_server=self._keep_server)
            ran = True
            _raise_failure(result)
            return read_results(folder, sorted(w.local_rank for w in plan.workers))
        finally:
            if server is not None and not (ran and self._keep_server and not server.gone):
                server.close()
                if server in _KEPT:
                    _KEPT.remove(server)
            shutil.rmtree(folder, ignore_errors=True)


#: what the fork server imports for a call besides torch: its runner (the runtime API), which
#: every worker of a call imports first otherwise (and cloudpickle where installed: _preload)
CALL_PRELOAD = ("unirank.runtime.worker",)

#: the fork server kept between calls of :func:`launch` in this process (one at most)
_KEPT: list[Any] = []


def _preload() -> tuple[str, ...]:
    """:data:`CALL_PRELOAD`, and cloudpickle where it is installed (a call from a notebook
    comes pickled with it)."""
    found = importlib.util.find_spec("cloudpickle") is not None
    return (*CALL_PRELOAD, "cloudpickle") if found else CALL_PRELOAD


def _builds_ddp(path: str, fn: Callable[..., Any]) -> bool:
    """Whether the call in ``path`` (a function sent by value carries the names it uses) or the
    source file of ``fn`` (one sent by name) names DDP, FSDP, ``torch.compile`` or
    ``auto_model``: its workers then import part of ``torch._dynamo``, which the fork server
    imports once instead (:data:`~unirank.supervisor.fork.client.WARM_PRELOAD`)."""
    from unirank.supervisor.fork.client import warm_for

    texts = [path]
    with contextlib.suppress(TypeError, OSError):
        source = inspect.getsourcefile(fn)
        if source is not None:
            texts.append(source)
    for name in texts:
        with contextlib.suppress(OSError), open(name, "rb") as fh:
            if warm_for(fh.read(1 << 20)):
                return True
    return False


def _fork_server(path: str, *, keep: bool, warm: bool = False) -> Any:
    """The fork server for a spawn: with ``keep``, the one an earlier call kept while it can
    still serve this process's environment (and imported a DDP job's first-step modules when
    ``warm`` asks for them), else a new one (kept in turn)."""
    from unirank.supervisor.fork.client import WARM_PRELOAD, start_server

    if keep and _KEPT:
        server = _KEPT[0]
        if not server.gone and server.why_not(os.environ) is None and (server.warm or not warm):
            server.told = False
            return server
        server.close()
        _KEPT.clear()
    preload = (*_preload(), *WARM_PRELOAD) if warm else _preload()
    server = start_server(["--call", path], os.environ, preload, prog=PROG)
    if keep and server is not None:
        _KEPT.append(server)
    return server


def _raise_failure(result: Any) -> None:
    """After a spawn: nothing when every worker succeeded; the root cause's ConfigError again
    (one line, no summary: the mistake is the same on every rank); SystemExit(79) after one
    line when the workers stopped to be requeued (``ur.exit_for_requeue``); SystemExit(128 +
    signal) after one line when a forwarded SIGTERM stopped workers that did not fail; else the
    failure summary on stderr and :class:`WorkerFailedError` (KeyboardInterrupt after a
    forwarded SIGINT)."""
    from unirank.supervisor.summary import format_summary

    first = result.first_failure
    if first is not None and first.config_error and result.stop_signal is None:
        raise ConfigError(first.error.removeprefix("ConfigError: "))
    summary = format_summary(result, prog=PROG)
    if summary:
        sys.stderr.write(summary)
        sys.stderr.flush()
    if result.stop_signal == signal.SIGINT:
        raise KeyboardInterrupt
    if result.requeued:  # the workers saved and stopped to go on later: no failure
        raise SystemExit(result.exit_code)
    if result.stop_signal is not None and first is None:  # stopped (SIGTERM): 128 + it
        raise SystemExit(result.exit_code)
    if result.exit_code != 0 and first is not None:
        code = (first.returncode if first.returncode < 0 and not first.stopped
                else first.own_exit_code)
        last = first.error or next(
            (line.strip() for line in reversed(first.stderr_tail) if line.strip()), "")
        text = _traceback_of(list(first.stderr_tail))
        error = WorkerFailedError(first.local_rank, first.rank, code, last, text)
        if text:
            raise error from RankTraceback(text)
        raise error
    if result.exit_code != 0:
        raise WorkerFailedError(-1, -1, result.exit_code)


#: the most lines of a rank's traceback that :class:`RankTraceback` shows
TRACEBACK_LINES = 200


#: the prefix torch's excepthook puts before a traceback's lines once a group started
_TORCH_PREFIX = re.compile(r"^\[rank\d+\]: ?")


def _traceback_of(lines: list[str]) -> str:
    """The last Python traceback in a worker's stderr tail (without the ``[rankN]:`` that
    torch's excepthook puts before each line), or "" when it printed none."""
    from unirank.supervisor.summary import traceback_excerpt

    excerpt = traceback_excerpt(lines, max_lines=TRACEBACK_LINES)
    if not excerpt or "Traceback (most recent call last):" not in excerpt[0]:
        return ""
    if all(_TORCH_PREFIX.match(line) for line in excerpt):
        excerpt = [_TORCH_PREFIX.sub("", line, count=1) for line in excerpt]
    return "\n".join(excerpt)
