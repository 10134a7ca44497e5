"""Starting, reaping and signalling one node's workers: the engine's mechanism.

* :func:`start_worker` starts one worker in its own session: from the node's fork server
  where it can (:mod:`.fork`), else as its own interpreter (saying why once). Its stdout and
  stderr go through pipes to the engine's :class:`~.streams.WorkerStreams`; the worker that
  hosts the rendezvous store gets the read end of a *linger pipe*, every other one the write
  end of a *done pipe* (see :mod:`.engine`).
* :func:`exit_code` reaps a worker without blocking (``wait4``, which gives its peak memory,
  or the fork server's report of it).
* :func:`send` signals a worker, or its whole process group.

Reads: no environment variable (the workers' environments come whole in each
:class:`~.workerlaunch.WorkerLaunch`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from unirank.supervisor.deathcause import memory_cgroup
from unirank.supervisor.fork.client import ForkServer, fallback_line
from unirank.supervisor.streams import WorkerStreams
from unirank.supervisor.workerlaunch import WorkerLaunch
from unirank.supervisor.workers import StartedWorker

__all__ = ["Started", "exit_code", "kill_all", "send", "start_worker"]


@dataclass(frozen=True)
class Started:
    """A worker just started, and the engine's ends of its pipes."""

    worker: StartedWorker
    #: the read end of its done pipe (None: it hosts the store)
    done_read: int | None
    #: the write end of the linger pipe (only for the store's host)
    linger_write: int | None


def start_worker(launch: WorkerLaunch, output: WorkerStreams, server: ForkServer | None, *,
                 out_fd: int, err_fd: int, say: Callable[[str], None]) -> Started:
    """Start one worker (see the module docstring); its stdout and stderr pipes are added to
    ``output`` (``out_fd``, ``err_fd``: the console's descriptors)."""
    out_targets = output.targets(out_fd if launch.stdout_console else None, launch.stdout_file)
    err_targets = output.targets(err_fd if launch.stderr_console else None, launch.stderr_file)
    store_fds = () if launch.wiring.store_fd is None else (launch.wiring.store_fd,)
    linger_read = linger_write = done_write = done_read = None
    if launch.hosts_store:
        linger_read, linger_write = os.pipe()
    else:
        done_read, done_write = os.pipe()
    fds = (*store_fds, *(fd for fd in (linger_read, done_write) if fd is not None))
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        env = launch.environ(linger_fd=linger_read, done_fd=done_write, started=time.time())
        pid, proc = _spawn(launch, env, (out_write, err_write), fds, server, say)
    except BaseException:
        for fd in (done_read, out_read, err_read, linger_write):
            if fd is not None:
                os.close(fd)
        raise
    finally:
        for fd in (linger_read, done_write, out_write, err_write):
            if fd is not None:
                os.close(fd)
    worker = StartedWorker(launch, pid, proc)
    worker.cgroup = memory_cgroup(pid)
    if done_read is not None:
        os.set_blocking(done_read, False)
    # stderr's bytes are kept too: its tail goes into the failure summary
    output.add(err_read, 2 * launch.local_rank + 1, err_targets, launch.prefix, worker.tail,
               launch.stderr_copy, console=(err_fd, launch.console_prefixes[1]))
    output.add(out_read, 2 * launch.local_rank, out_targets, launch.prefix, None,
               launch.stdout_copy, console=(out_fd, launch.console_prefixes[0]))
    return Started(worker, done_read, linger_write)


def _spawn(launch: WorkerLaunch, env: dict[str, str], stdio: tuple[int, int],
           fds: tuple[int, ...], server: ForkServer | None,
           say: Callable[[str], None]) -> tuple[int, subprocess.Popen[bytes] | None]:
    """Fork the worker from the fork server or, where it cannot, start it as its own
    interpreter (saying why once); its pid, and its Popen in the second case."""
    if server is not None:
        why = server.why_not(env)
        if why is None:
            answer = server.spawn(launch.target, env,
                                  [(stdio[0], 1), (stdio[1], 2), *((fd, fd) for fd in fds)])
            if isinstance(answer, int):
                return answer, None
            why = answer
        if not server.told:
            server.told = True
            say(fallback_line(why))
    proc = subprocess.Popen(list(launch.argv), env=env, stdout=stdio[0], stderr=stdio[1],
                            pass_fds=fds, start_new_session=True)
    return proc.pid, proc


def exit_code(worker: StartedWorker, server: ForkServer | None) -> int | None:
    """How ``worker`` ended, or None while it runs (notes its peak memory once reaped)."""
    if worker.proc is None:
        assert server is not None
        code = server.exit_code(worker.pid)
        worker.peak_kib = server.peak_memory(worker.pid)
        if code is None and server.gone:
            code = -int(signal.SIGKILL)  # its parent-death signal
        return code
    try:
        pid, status, usage = os.wait4(worker.pid, os.WNOHANG)
    except ChildProcessError:  # pragma: no cover - reaped elsewhere
        pid, status, usage = worker.pid, 255 << 8, None
    if pid == 0:
        return None
    worker.peak_kib = usage.ru_maxrss if usage is not None else None
    code = os.waitstatus_to_exitcode(status)
    worker.proc.returncode = code
    return code


def send(pid: int, signum: int, *, group: bool) -> None:
    """Signal a worker (``group``: its whole process group), ignoring ones already gone."""
    try:
        if group:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def kill_all(workers: Sequence[StartedWorker], server: ForkServer | None,
             kill_wait: float) -> None:
    """Leave nothing behind: SIGKILL every worker's process group (what a group still holds:
    rank 0's store, a program's children) and wait for each to end, at most ``kill_wait``
    seconds (a process stuck in the kernel may outlive that), noting how it ended."""
    for worker in workers:
        send(worker.pid, signal.SIGKILL, group=True)
    forked = [w.pid for w in workers if w.alive and w.proc is None]
    if forked and server is not None:
        server.wait_exits(forked, kill_wait)
    for worker in workers:
        if worker.alive and worker.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the kernel
                worker.returncode = worker.proc.wait(timeout=kill_wait)
        elif worker.alive:
            worker.returncode = exit_code(worker, server)
