"""Run one remote ``unirank run`` per host over ssh, and supervise them as one job.

- Output: each host's stdout and stderr come back through ssh's pipes and go to this
  process's stdout and stderr in whole lines (:class:`~unirank.supervisor.output.LineBuffer`),
  as the remote ``unirank run`` wrote them (its own prefixes kept).
- Stop: the ssh clients run in their own sessions (a terminal's Ctrl-C reaches only this
  process); SIGINT or SIGTERM here closes every host's stdin, and each remote ``unirank run``
  then stops its workers (:mod:`unirank.supervisor.ssh.stdinwatch`). The same happens when
  this process dies by SIGKILL: the pipes close with it. A second signal, or the grace period
  plus :data:`STOP_SLACK_S` without an end, kills the ssh clients.
- Failure: the first host whose ``unirank run`` ends non-zero stops every other host (each
  prints its own summary); in an elastic job (``--nnodes MIN:MAX``) a host that ends
  non-zero is only named (a lost host: the others' rendezvous goes on without it), and the
  job ends 0 where a host finished 0. The root cause is the first host where a worker
  failed on its own account, not by losing a peer: each remote side's last stderr line
  (:func:`~unirank.supervisor.ssh.remote.verdict_line`, not shown) says so. A host whose
  workers only lost a peer may end first (it does not wait for the failed host's teardown):
  it is named only when no host says more; after those, the first host that ended before it
  was told to stop, then the first that failed. A last line names the host;
  the exit code is its (ssh's own failure is 255).

Signals reach the loop through a wakeup fd; the handler does nothing. Reads no environment
variable.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType

from unirank.exitcodes import killed_by
from unirank.signals import HOSTS_STOP
from unirank.supervisor.output import LineBuffer
from unirank.supervisor.ssh.remote import VERDICT_MARK, parse_verdict
from unirank.supervisor.summary import signal_name

__all__ = ["STOP_SLACK_S", "HostRun", "run_hosts"]

#: seconds after the grace period that stopped hosts get before their ssh clients are killed
STOP_SLACK_S = 10.0


@dataclass(frozen=True)
class HostRun:
    """One host's ssh command and what its stdin gets first."""

    host: str
    node_rank: int
    argv: tuple[str, ...]
    first_line: bytes


@dataclass
class _Remote:
    run: HostRun
    proc: subprocess.Popen[bytes]
    #: fd -> (its whole-line buffer, the fd it goes to: 1 or 2)
    buffers: dict[int, tuple[LineBuffer, int]] = field(default_factory=dict)
    code: int | None = None
    tail: list[str] = field(default_factory=list)
    #: (a worker failed there on its own, its failure only saw a peer go away): its verdict line
    verdict: tuple[bool, bool] = (False, False)
    #: it was told to stop (its stdin closed) before it ended
    stopped: bool = False


def _ignore(signum: int, frame: FrameType | None) -> None:
    """Installed for the stop signals: they arrive through the wakeup fd."""


class _FanOut:
    def __init__(self, runs: Sequence[HostRun], grace: float, elastic: bool = False) -> None:
        self._runs = runs
        self._grace = grace
        self._elastic = elastic
        self._selector = selectors.DefaultSelector()
        self._remotes: list[_Remote] = []
        self._failures: list[_Remote] = []
        self._signal: int | None = None
        self._kill_at: float | None = None

    def start(self) -> None:
        for run in self._runs:
            proc = subprocess.Popen(list(run.argv), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
            remote = _Remote(run, proc)
            self._remotes.append(remote)
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
            try:
                proc.stdin.write(run.first_line)
                proc.stdin.flush()
            except OSError:
                pass  # ssh already gone: its exit tells why
            for stream, target in ((proc.stdout, 1), (proc.stderr, 2)):
                fd = stream.fileno()
                os.set_blocking(fd, False)
                remote.buffers[fd] = (LineBuffer(), target)
                self._selector.register(fd, selectors.EVENT_READ, remote)

    def loop(self, wake_r: int) -> None:
        self._selector.register(wake_r, selectors.EVENT_READ, None)
        while any(r.code is None for r in self._remotes):
            now = time.monotonic()
            if self._kill_at is not None and now >= self._kill_at:
                self._kill_all()
                self._kill_at = None
            for key, _ in self._selector.select(self._timeout(now)):
                if key.data is None:
                    self._on_wakeup(wake_r)
                else:
                    self._on_output(key.fd, key.data)
            self._flush_partials(time.monotonic())

    def _timeout(self, now: float) -> float:
        due = [b.deadline for r in self._remotes for b, _ in r.buffers.values()
               if b.deadline is not None]
        if self._kill_at is not None:
            due.append(self._kill_at)
        return max(0.0, min(due) - now) if due else 1.0

    def _on_output(self, fd: int, remote: _Remote) -> None:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        buffer, target = remote.buffers[fd]
        if data:
            _write(target, _shown(buffer.feed(data, time.monotonic()), remote),
                   remote if target == 2 else None)
            return
        _write(target, _shown(buffer.flush_partial(), remote), remote if target == 2 else None)
        self._selector.unregister(fd)
        del remote.buffers[fd]
        if not remote.buffers:
            self._on_exit(remote)

    def _flush_partials(self, now: float) -> None:
        for remote in self._remotes:
            for buffer, target in remote.buffers.values():
                if buffer.deadline is not None and now >= buffer.deadline:
                    _write(target, buffer.flush_partial(), None)

    def _on_exit(self, remote: _Remote) -> None:
        try:
            remote.code = remote.proc.wait(timeout=STOP_SLACK_S)
        except subprocess.TimeoutExpired:
            remote.proc.kill()
            remote.code = remote.proc.wait(timeout=STOP_SLACK_S)
        remote.stopped = remote.proc.stdin is None or remote.proc.stdin.closed
        if remote.code != 0 and self._signal is None:
            self._failures.append(remote)
            if self._elastic and any(r.proc.poll() is None for r in self._remotes):
                say(f"host {remote.run.host} is lost: its unirank run ended with exit code "
                    f"{remote.code}; the other hosts go on (--nnodes MIN:MAX)")
            elif len(self._failures) == 1:
                self._stop_all()

    def _on_wakeup(self, wake_r: int) -> None:
        try:
            data = os.read(wake_r, 512)
        except BlockingIOError:
            return
        for signum in data:
            if self._signal is not None:
                say(f"got {signal_name(signum)} again: killing the ssh clients")
                self._kill_all()
                continue
            self._signal = signum
            say(f"got {signal_name(signum)}: stopping the workers on every host "
                f"({signal_name(signum)} again to kill the ssh clients now)")
            self._stop_all()

    def _stop_all(self) -> None:
        """Close every host's stdin: each remote unirank run stops its workers."""
        for remote in self._remotes:
            if remote.proc.stdin is not None and not remote.proc.stdin.closed:
                with contextlib.suppress(OSError):
                    remote.proc.stdin.close()
        self._kill_at = time.monotonic() + self._grace + STOP_SLACK_S

    def _kill_all(self) -> None:
        for remote in self._remotes:
            if remote.proc.poll() is None:
                remote.proc.kill()

    def _root_cause(self) -> _Remote | None:
        """The first host that failed on its own account (see the module's docstring)."""
        def rank(r: _Remote) -> tuple[bool, bool]:  # lower first
            return r.verdict != (True, False), r.stopped

        return min(self._failures, key=rank, default=None)

    def exit_code(self) -> int:
        if self._elastic and self._signal is None and any(r.code == 0 for r in self._remotes):
            return 0  # a lost host survived: named when it ended
        remote = self._root_cause()
        if remote is not None:
            code = remote.code if remote.code is not None else 1
            what = ("ssh failed" if code == 255 else "unirank run failed")
            last = f": {remote.tail[-1]}" if code == 255 and remote.tail else ""
            say(f"host {remote.run.host} (node rank {remote.run.node_rank}) ended the job: "
                f"{what} with exit code {code}{last}")
            return code
        if self._signal is not None:
            return killed_by(self._signal)
        return next((r.code for r in self._remotes if r.code), 0) or 0

    def close(self) -> None:
        self._kill_all()
        for remote in self._remotes:
            for stream in (remote.proc.stdin, remote.proc.stdout, remote.proc.stderr):
                if stream is not None:
                    stream.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                remote.proc.wait(timeout=STOP_SLACK_S)
        self._selector.close()


def _shown(data: bytes, remote: _Remote) -> bytes:
    """``data`` (whole lines) without the remote side's verdict line, noted on ``remote``."""
    if VERDICT_MARK not in data:
        return data
    kept = []
    for line in data.splitlines(keepends=True):
        verdict = parse_verdict(line.rstrip(b"\r\n"))
        if verdict is None:
            kept.append(line)
        else:
            remote.verdict = verdict
    return b"".join(kept)


def _write(fd: int, data: bytes, remote: _Remote | None) -> None:
    if not data:
        return
    if remote is not None:
        remote.tail = (remote.tail + data.decode(errors="replace").splitlines())[-5:]
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except OSError:  # the console is gone: the job goes on
            return


def say(line: str) -> None:
    """One line of this launcher's own on stderr."""
    print(f"unirank run: {line}", file=sys.stderr, flush=True)


def run_hosts(runs: Sequence[HostRun], grace: float, *, elastic: bool = False) -> int:
    """Start every host's ssh, supervise them until all have ended; the job's exit code
    (``elastic``: a host that ends non-zero while others run is lost, not the job's end).
    Must run in the main thread (it handles signals)."""
    fan = _FanOut(runs, grace, elastic)
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    old = {sig: signal.signal(sig, _ignore) for sig in HOSTS_STOP}
    try:
        fan.start()
        fan.loop(wake_r)
        return fan.exit_code()
    finally:
        fan.close()
        signal.set_wakeup_fd(old_wakeup)
        for sig, handler in old.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        os.close(wake_r)
        os.close(wake_w)
