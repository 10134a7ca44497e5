"""The preloading fork server: ``python -m unirank.supervisor.fork.server --control FD
[--preload MODULE,...]``.

One per node and run. It imports torch (and the ``--preload`` modules) once, then forks one
worker per request of its supervisor (:mod:`.client`), which talks to it over the
``SOCK_SEQPACKET`` socket ``FD`` in the messages of :mod:`.protocol`: the environment to import
with first, then a spawn per worker, its pipes passed with ``SCM_RIGHTS``. The server answers
``ready`` (or ``error``) once, then a ``pid`` (or ``refused``) per spawn, and an ``exit`` per
worker that ended (the server reaps its workers and passes their exit codes and peak memory
on).

Runs in the server process, started by :mod:`.client` in the ``unirank run`` parent (or
``Parallel``'s process); after a fork, in the child until it becomes its worker.

Fork safety, checked before every fork (a request is refused, with the reason, otherwise):

* CUDA is not initialised in the server (a forked child could not use the GPU);
* no thread runs in the server (``/proc/self/task`` holds one entry): a lock held by another
  thread would stay locked forever in the child. OpenBLAS starts its thread pool when it is
  loaded, so the server is started with ``OPENBLAS_NUM_THREADS=1``
  (:data:`.importtime.SERVER_ONLY`) and each worker sets its own count back
  (:mod:`.importtime`);
* nothing is imported that would start threads lazily: the server calls no torch operation.

The server imports with the garbage collector off (a tenth faster; the import leaves about a
megabyte of cyclic garbage, shared by the workers), then moves every object into the permanent
generation (``gc.freeze``) so that the workers' collections do not write to, and so copy, the
pages they share, and turns the collector back on for the workers.

The forked child leaves the server's loop and returns to :func:`main`, which turns it into the
worker (:func:`.child.become_worker`): the worker then ends as an interpreter does (atexit
handlers, ``SystemExit``'s code, a traceback and exit code 1 for an uncaught exception), without
the module teardown.

The server lives until its supervisor closes the socket, and dies with it (parent-death
signal); its workers die with the server. It ignores the signals that a batch system sends to
every process of a job step (``scancel --signal``, a time limit's SIGTERM:
:data:`unirank.signals.SHIELDED`; it is started by
:func:`unirank.supervisor.helper.start_helper`): its death would kill the workers before
they could act on them; the supervisor forwards them. A forked worker gets the dispositions a
child the supervisor exec'ed would have, not the server's (:mod:`.dispositions`: the
supervisor's ignored signals come with each spawn).

Reads: nothing from the environment: its first message is the workers' common environment,
which it takes (``os.environ``, so C's ``getenv`` too) before it imports.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import select
import signal
import socket
import sys
import time
from types import FrameType

from unirank.signals import SHIELDED
from unirank.supervisor.fork.dispositions import after_exec, apply
from unirank.supervisor.fork.protocol import (
    MAX_FDS,
    MAX_MESSAGE,
    Message,
    Request,
    decode,
    encode,
    environ_of,
    error_message,
    exit_message,
    pid_message,
    ready_message,
    refused_message,
    request_of,
)
from unirank.supervisor.helper import shield
from unirank.words import counted

__all__ = ["SHIELDED", "fork_hazard", "main"]

USAGE = ("python -m unirank.supervisor.fork.server --control FD [--supervisor PID] "
         "[--preload MODULE,...]")
#: how long the server waits for a forked child to take its own session
CHILD_READY_TIMEOUT = 60.0


def fork_hazard() -> str | None:
    """Why forking now would be unsafe (CUDA initialised, another thread running), or None."""
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        return "CUDA was initialised while preloading"
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        return "cannot count the server's threads (/proc/self/task)"
    if threads != 1:
        return f"{counted(threads - 1, 'thread')} besides the main one run after preloading"
    return None


def _send(control: socket.socket, message: Message) -> None:
    with contextlib.suppress(OSError):  # the supervisor is gone: the server ends at next read
        control.sendmsg([encode(message)])


def _preload(modules: list[str]) -> str | None:
    """Import ``modules``; the reason the server cannot serve, or None."""
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # any failure means: start workers the usual way
            return f"importing {name} failed: {type(exc).__name__}: {exc}"
    return fork_hazard()


def _noop(signum: int, frame: FrameType | None) -> None:
    """SIGCHLD arrives through the wakeup fd; the handler itself does nothing."""


class _Server:
    def __init__(self, control: socket.socket, preloaded: tuple[float, float]) -> None:
        self.control = control
        self.preloaded = preloaded
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)

    def serve(self) -> Request | None:
        """Fork a worker per request and report exits until the supervisor closes the socket;
        returns None in the server, a :class:`Request` in a forked child."""
        signal.signal(signal.SIGCHLD, _noop)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        self._reap()
        while True:
            readable, _, _ = select.select([self.control.fileno(), self.wake_r], [], [])
            if self.wake_r in readable:
                self._drain_wakeup()
                self._reap()
            if self.control.fileno() not in readable:
                continue
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.control, MAX_MESSAGE, MAX_FDS)
            except OSError:
                data, fds = b"", []
            if not data:
                return None
            request = self._fork(decode(data), fds)
            if request is not None:
                return request

    def _drain_wakeup(self) -> None:
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def _reap(self) -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            _send(self.control, exit_message(pid, os.waitstatus_to_exitcode(status),
                                             usage.ru_maxrss))

    def _fork(self, message: Message, fds: list[int]) -> Request | None:
        hazard = fork_hazard()
        if hazard is not None:
            for fd in fds:
                os.close(fd)
            _send(self.control, refused_message(hazard))
            return None
        ready_r, ready_w = os.pipe()
        server_pid = os.getpid()
        forked_at = time.time()
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            return self._child(message, fds, (ready_w, server_pid), forked_at)
        os.close(ready_w)
        for fd in fds:
            os.close(fd)
        # the child has its own session (so that its group can be signalled) once it closes
        # its end of the ready pipe
        select.select([ready_r], [], [], CHILD_READY_TIMEOUT)
        os.close(ready_r)
        _send(self.control, pid_message(pid))
        return None

    def _child(self, message: Message, fds: list[int], ready: tuple[int, int],
               forked_at: float) -> Request:
        """In the forked child: its own signals and session, death with the server (``ready``:
        the pipe to close once done, and the server's pid), the server's descriptors closed."""
        ready_w, server_pid = ready
        signal.set_wakeup_fd(-1)
        request = request_of(message, fds, forked_at, self.preloaded)
        apply(after_exec(request.ignored))  # a child the supervisor exec'ed would have these
        os.setsid()
        from unirank.supervisor.worker.pdeathsig import die_with_parent

        die_with_parent(server_pid, signal.SIGKILL)
        os.close(ready_w)
        for fd in (self.control.detach(), self.wake_r, self.wake_w):
            os.close(fd)
        return request


def _arguments(argv: list[str]) -> dict[str, str]:
    """``--control FD --supervisor PID --preload MODULE,...`` (what :mod:`.client` passes;
    no argparse: the server's start is on every run's critical path)."""
    pairs = dict(zip(argv[::2], argv[1::2]))
    if len(argv) % 2 or not pairs.get("--control", "").isdigit():
        raise SystemExit(f"usage: {USAGE}")
    return pairs


def main(argv: list[str] | None = None) -> int:
    """Preload, serve, and in a forked child become the worker (see the module docstring)."""
    shield()  # started by start_helper: shielded already; unblock them
    args = _arguments(sys.argv[1:] if argv is None else argv)
    if args.get("--supervisor", "").isdigit():
        from unirank.supervisor.worker.pdeathsig import die_with_parent

        die_with_parent(int(args["--supervisor"]), signal.SIGKILL)
    control = socket.socket(fileno=int(args["--control"]))
    control.set_inheritable(False)
    try:
        data = control.recv(MAX_MESSAGE)  # the workers' common environment
    except OSError:
        data = b""
    if not data:
        os._exit(0)
    os.environ.clear()
    os.environ.update(environ_of(decode(data)))
    started = time.time()
    gc.disable()  # the import makes little cyclic garbage, and collecting it is a tenth of it
    why = _preload([m for m in args.get("--preload", "torch").split(",") if m])
    if why is not None:
        _send(control, error_message(why))
        sys.stderr.flush()
        os._exit(1)  # not sys.exit: a non-daemon thread a preload started would keep it alive
    preloaded = (started, time.time())
    gc.freeze()
    gc.enable()  # in the workers, as in any interpreter
    _send(control, ready_message(preloaded))
    request = _Server(control, preloaded).serve()
    if request is None:
        os._exit(0)  # the server ran no program: nothing to flush, no teardown to wait for
    from unirank.supervisor.fork.child import become_worker

    become_worker(request)


if __name__ == "__main__":
    sys.exit(main())
