"""The supervisor's side of the fork server (:mod:`.server`): start it, ask it for workers,
hear how they ended. Imports no torch.

``unirank run`` and ``Parallel`` start one server per run (:func:`start_server`, the one rule
for whether to) as early as they can, before planning; :func:`~..attempts.run_plan` then sends
it the environment every worker of the node has in common (:func:`server_environ`,
:meth:`ForkServer.configure`), which the server takes before it imports, so that what the
libraries read at import is the workers' own. Each worker is then one request: its target, its
environment as differences from the server's, and its descriptors (stdout, stderr, the store
socket, the linger or done pipe), which the server's child puts at the numbers the worker's
environment names.

A job whose script builds a DDP or FSDP model, or compiles one (:func:`warm_modules`), has the
server import :data:`WARM_PRELOAD` too: what DDP's construction imports (through
``torch._dynamo``) that is safe to import before the fork.

What the server cannot serve starts as its own interpreter, as before (:func:`why_not_served`
and :meth:`ForkServer.why_not`): ``--no-python``, a platform without ``fork`` and
``SCM_RIGHTS``, a worker whose interpreter start-up variables (``PYTHON*``, ``LD_*``) differ
from the server's, a server that failed to import or found a fork hazard.

Runs in the ``unirank run`` parent (or ``Parallel``'s process); what it sends and hears is
:mod:`.protocol`'s.

Reads (from the ``environ`` it is given): UNIRANK_NO_PRELOAD.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from unirank.contract import NO_PRELOAD_VAR, flag
from unirank.supervisor.fork.dispositions import ignored_here
from unirank.supervisor.fork.importtime import SERVER_ONLY
from unirank.supervisor.fork.protocol import (
    MAX_MESSAGE,
    decode,
    encode,
    environ_message,
    exit_of,
    pid_of,
    ready_of,
    spawn_message,
)
from unirank.supervisor.helper import start_helper

__all__ = ["DEFAULT_PRELOAD", "READY_TIMEOUT", "WARM_PRELOAD", "ForkServer", "fallback_line",
           "server_environ", "start_server", "warm_for", "warm_modules", "why_not_served"]

#: what the server always imports; ``--preload`` adds to it. The hang watcher is on by
#: default (each worker starts one before the script): about 50 ms of imports a worker would
#: otherwise do after the fork, from modules that hold no thread and read no environment
#: variable when imported
DEFAULT_PRELOAD = ("torch", "torch.distributed", "unirank.supervisor.fork.child",
                   "unirank.hang.watcher")
#: what a DDP job's first step imports that the server may import too: about half of
#: ``torch._dynamo``'s import, which DDP's constructor triggers in every worker. They start no
#: thread and keep no per-process state. ``torch._dynamo`` itself, ``torch._inductor``,
#: ``torch.distributed.fsdp`` and ``torch.distributed.nn`` are left out: imported before the
#: script runs they make a DDP script that ends with ``destroy_process_group()`` hang at its
#: end (torch's gloo thread waits for the GIL while the main thread joins it; run.md)
WARM_PRELOAD = ("sympy", "torch.fx.experimental.symbolic_shapes", "torch.distributed.tensor")
#: the variables :data:`WARM_PRELOAD` reads when imported: a worker whose values differ from
#: those the server imported with cannot be forked from it
_WARM_PREFIXES = ("SYMPY_", "MPMATH_")
#: what names a script that builds a DDP or FSDP model, or compiles one, or keeps its state
#: with DCP (which imports ``torch.distributed.tensor``: at every restart)
_WARM_MARKS = (b"DistributedDataParallel", b"FullyShardedDataParallel", b"fully_shard",
               b"torch.compile", b"auto_model", b"DTensor", b"device_mesh",
               b"torch.distributed.checkpoint", b"save_state", b"load_state")
#: how much of a script :func:`warm_modules` reads
_SCAN_BYTES = 1 << 20
#: how long the server may take to import (a cold shared filesystem is slow)
READY_TIMEOUT = 600.0
#: how long one fork may take to be answered
SPAWN_TIMEOUT = 60.0
#: what the interpreter or the dynamic loader read when a process starts: a worker whose values
#: differ from the server's cannot be forked from it
_START_TIME_PREFIXES = ("PYTHON", "LD_", "MALLOC_", "GLIBC_TUNABLES")
#: start-up variables a forked worker applies itself (:mod:`.child`)
_APPLIED_AFTER_FORK = frozenset({"PYTHONUNBUFFERED"})


def why_not_served(target: Sequence[str]) -> str | None:
    """Why no worker of this run can be forked from a server (None: they can)."""
    if target and target[0] == "--exec":
        return "--no-python runs a program, not Python"
    if not sys.platform.startswith("linux"):
        return f"forking workers from a preloaded server needs Linux (this is {sys.platform})"
    return None


def fallback_line(why: str) -> str:
    """The one line said when workers start as their own interpreters instead (``why``)."""
    return f"starting workers as their own interpreters: {why}"


def warm_modules(target: Sequence[str]) -> tuple[str, ...]:
    """:data:`WARM_PRELOAD` when ``target`` is a script (``SCRIPT ARGS``) whose text names DDP,
    FSDP, ``torch.compile`` or ``ur.auto_model``; otherwise nothing (a module, a program, a
    function, a script it cannot read), so that other jobs start as fast as before."""
    if not target or target[0] in ("-m", "--exec", "--call"):
        return ()
    try:
        with open(target[0], "rb") as script:
            text = script.read(_SCAN_BYTES)
    except OSError:
        return ()
    return warm_for(text)


def warm_for(text: bytes) -> tuple[str, ...]:
    """:data:`WARM_PRELOAD` when ``text`` (a script, a pickled call, a module's source) names
    DDP, FSDP, ``torch.compile``, ``ur.auto_model``, DTensor, DCP or ``ur.save_state`` /
    ``load_state``; otherwise nothing."""
    return WARM_PRELOAD if any(mark in text for mark in _WARM_MARKS) else ()


def start_server(target: Sequence[str], environ: Mapping[str, str],
                 preload: Sequence[str] | None, *, prog: str, err_fd: int = 2) -> ForkServer | None:
    """Start the node's fork server, unless it is off (``preload`` None, UNIRANK_NO_PRELOAD=1)
    or cannot serve this run (then say why, once). It imports ``preload`` and
    :func:`warm_modules` besides :data:`DEFAULT_PRELOAD`.

    Reads (from ``environ``): UNIRANK_NO_PRELOAD.
    """
    if preload is None or flag(environ, NO_PRELOAD_VAR):
        return None
    why = why_not_served(target)
    if why is not None:
        os.write(err_fd, f"{prog}: {fallback_line(why)}\n".encode())
        return None
    return ForkServer.start(environ, [*warm_modules(target), *preload], err_fd)


def server_environ(environs: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """The server's environment: what every worker's has in common, plus
    :data:`~.importtime.SERVER_ONLY` where the workers do not set it."""
    common = dict(environs[0]) if environs else {}
    for env in environs[1:]:
        common = {k: v for k, v in common.items() if env.get(k) == v}
    for name, value in SERVER_ONLY.items():
        common.setdefault(name, value)
    return common


class ForkServer:
    """One running fork server (see the module docstring)."""

    def __init__(self, proc: subprocess.Popen[bytes], control: socket.socket,
                 environ: Mapping[str, str], import_prefixes: tuple[str, ...] = ()) -> None:
        self._proc = proc
        #: the variables its preloaded modules read at import (see :meth:`why_not`)
        self._import_prefixes = import_prefixes
        self._control = control
        #: what the server's interpreter started with, then what it imported with
        self._started_with = dict(environ)
        self._environ = dict(environ)
        #: :meth:`configure` sent the environment to import with
        self._configured = False
        self._exits: dict[int, int] = {}
        #: each ended worker's peak resident memory, in KiB (``ru_maxrss``)
        self._peaks: dict[int, int] = {}
        self._replies: list[dict[str, Any]] = []
        #: why it cannot serve (set once; it then starts nothing)
        self.broken: str | None = None
        #: when its imports started and ended
        self.preloaded: tuple[float, float] | None = None
        #: whether the engine already said why a worker was not forked
        self.told = False
        #: the server ended (its workers died with it)
        self.gone = False

    @classmethod
    def start(cls, environ: Mapping[str, str], modules: Sequence[str],
              err_fd: int) -> ForkServer:
        """Start the server's interpreter; it imports once :meth:`configure` gave it the
        workers' common environment."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        args = ["--control", str(theirs.fileno()), "--supervisor", str(os.getpid()),
                "--preload", ",".join(dict.fromkeys([*DEFAULT_PRELOAD, *modules]))]
        try:
            proc = start_helper("unirank.supervisor.fork.server", args, environ,
                                stderr=err_fd, pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        warm = any(name in WARM_PRELOAD for name in modules)
        return cls(proc, ours, environ, _WARM_PREFIXES if warm else ())

    @property
    def warm(self) -> bool:
        """Whether it imported :data:`WARM_PRELOAD` (a DDP job's first-step imports)."""
        return bool(self._import_prefixes)

    # -- messages -----------------------------------------------------------------------------

    def fileno(self) -> int:
        """The socket the engine watches for exits."""
        return self._control.fileno()

    def _take(self, timeout: float) -> bool:
        """Read one message (an exit, or a reply kept for :meth:`_reply`); False when none came
        within ``timeout`` or the server is gone."""
        if self.gone:
            return False
        readable, _, _ = select.select([self._control], [], [], max(0.0, timeout))
        if not readable:
            return False
        try:
            data = self._control.recv(MAX_MESSAGE)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self.gone = True
            self.broken = self.broken or "the fork server ended"
            return False
        message = decode(data)
        ended = exit_of(message)
        if ended is not None:
            self._exits[ended[0]] = ended[1]
            if ended[2] is not None:
                self._peaks[ended[0]] = ended[2]
        else:
            self._replies.append(message)
        return True

    def read_events(self) -> None:
        """Take every message waiting, without blocking (see :attr:`gone`)."""
        while self._take(0.0):
            pass

    def _take_until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Take messages until ``done()``; False when the server is gone or ``timeout`` passed
        first."""
        deadline = time.monotonic() + timeout
        while not done():
            remaining = deadline - time.monotonic()
            if not self._take(remaining) and (self.gone or remaining <= 0):
                return False
        return True

    def _reply(self, timeout: float) -> dict[str, Any] | None:
        if not self._take_until(lambda: bool(self._replies), timeout):
            return None
        return self._replies.pop(0)

    def exit_code(self, pid: int) -> int | None:
        """How worker ``pid`` ended (as ``Popen.returncode``), once the server reported it."""
        return self._exits.pop(pid, None)

    def peak_memory(self, pid: int) -> int | None:
        """Worker ``pid``'s peak resident memory in KiB, once the server reported its end."""
        return self._peaks.pop(pid, None)

    # -- life ---------------------------------------------------------------------------------

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> str | None:
        """Wait until the server imported; why it cannot serve, or None."""
        if self.preloaded is None and self.broken is None:
            reply = self._reply(timeout)
            if reply is None:
                self.broken = self.broken or f"the fork server did not import in {timeout:g} s"
            elif isinstance(preloaded := ready_of(reply), str):
                self.broken = f"the fork server could not preload: {preloaded}"
            else:
                self.preloaded = preloaded
        if self.broken is not None:
            self.close()
        return self.broken

    def configure(self, environ: Mapping[str, str]) -> None:
        """Give the server the environment to import with (:func:`server_environ`), once: a
        server kept for another run (``ur.launch``) keeps what it imported with, and each
        worker's request carries its differences from that."""
        if self._configured:
            return
        self._configured = True
        self._environ = dict(environ)
        try:
            self._control.sendmsg([encode(environ_message(self._environ))])
        except OSError as exc:
            self.broken = f"the fork server is unreachable ({exc.strerror or exc})"

    def why_not(self, environ: Mapping[str, str]) -> str | None:
        """Why this worker (its whole environment) cannot be forked from the server: the
        server is broken, a variable read when an interpreter starts differs (but
        PYTHONUNBUFFERED, which the worker applies itself), or one that a warm module
        (:data:`WARM_PRELOAD`) read at import differs from what the server imported with."""
        if self.broken is not None:
            return self.broken
        for name in set(environ) | set(self._started_with):
            if name.startswith(_START_TIME_PREFIXES) and name not in _APPLIED_AFTER_FORK and \
                    environ.get(name) != self._started_with.get(name):
                return f"{name} differs between this worker and the fork server"
        for name in set(environ) | set(self._environ):
            if name.startswith(self._import_prefixes) and \
                    environ.get(name) != self._environ.get(name):
                return f"{name} differs between this worker and the fork server's imports"
        return None

    def spawn(self, target: Sequence[str], environ: Mapping[str, str],
              fds: Sequence[tuple[int, int]]) -> int | str:
        """Fork one worker: its pid, or why the server refused (then it starts nothing)."""
        changed = {k: v for k, v in environ.items() if self._environ.get(k) != v}
        message = spawn_message(target, changed, [k for k in self._environ if k not in environ],
                                [number for _fd, number in fds], ignored_here())
        try:
            socket.send_fds(self._control, [encode(message)], [fd for fd, _number in fds])
        except OSError as exc:
            self.broken = f"the fork server is unreachable ({exc.strerror or exc})"
            return self.broken
        reply = self._reply(SPAWN_TIMEOUT)
        if reply is None:
            self.broken = self.broken or f"the fork server did not fork in {SPAWN_TIMEOUT:g} s"
            return self.broken
        return pid_of(reply)

    def wait_exits(self, pids: Sequence[int], timeout: float) -> None:
        """Wait (at most ``timeout``) until the server reported each of ``pids``."""
        self._take_until(lambda: all(p in self._exits for p in pids), timeout)

    def close(self, timeout: float = 10.0) -> None:
        """End the server: it ends when its socket closes (its workers with it). Idempotent."""
        self.gone = True
        self.broken = self.broken or "the fork server was closed"
        with contextlib.suppress(OSError):
            self._control.close()
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=timeout)
