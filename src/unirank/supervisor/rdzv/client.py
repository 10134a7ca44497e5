"""The parent's side of the dynamic rendezvous: start the helper (:mod:`.agent`), read its
answer with a deadline, end it. No torch here.

The helper's stderr goes to ``helper.log`` in a temporary folder of this process's
(``unirank-rdzv-XXXX``, :func:`unirank.sweep.make_owned_folder`), kept and named in the error
when the helper fails on its own (not a refusal) and wrote something, else removed at
:meth:`RendezvousHelper.close`; one that a SIGKILLed run left is swept by a later run
(:mod:`unirank.sweep`). Reads TMPDIR (through :func:`tempfile.gettempdir`); the helper's
environment is the mapping it is given.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

from unirank.errors import ConfigError
from unirank.exitcodes import EVICTED as EVICTED_EXIT
from unirank.runfolder import RunFolder, write_slow_link, write_spares
from unirank.supervisor.helper import start_helper
from unirank.supervisor.rdzv.conf import CLOSE_TIMEOUT
from unirank.supervisor.rdzv.messages import ENDED, EVICTED, MOVED
from unirank.supervisor.rdzv.spec import Assignment, RdzvSpec, assignment_of, to_line
from unirank.sweep import RDZV_PREFIX, make_owned_folder

__all__ = ["ANSWER_MARGIN", "RendezvousHelper", "StoppedWaiting", "aside_of", "spares_told"]

#: seconds the parent waits for an answer beyond the join timeout (the helper's start and its
#: connect)
ANSWER_MARGIN = 60.0


def assignment_of_error(line: str) -> ConfigError:
    """The one-line error of a refusal line."""
    try:
        assignment_of(line, where="the rendezvous helper")
    except ConfigError as exc:
        return exc
    return ConfigError(line, hint="")


def _spawn(environ: Mapping[str, str], err_fd: int) -> subprocess.Popen[bytes]:
    """Start the helper process: its stdin and stdout piped to the parent, stderr to
    ``err_fd``."""
    return start_helper("unirank.supervisor.rdzv.agent", [], environ, stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, stderr=err_fd)


class StoppedWaiting(Exception):
    """A stop signal came while this node waited for a rendezvous round (no worker runs)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class RendezvousHelper:
    """One node's rendezvous helper process, for the whole run (it keeps the node alive in the
    rendezvous and, on the endpoint's node, serves the rendezvous store)."""

    def __init__(self, spec: RdzvSpec, environ: Mapping[str, str],
                 stop_fd: int | None = None) -> None:
        """``stop_fd``: the read end of the run's signal pipe
        (:func:`unirank.supervisor.wakeup.signals_on_a_pipe`), watched while a round is
        awaited: a signal on it other than SIGCHLD ends the wait (:class:`StoppedWaiting`)."""
        self.spec = spec
        self._stop_fd = stop_fd
        self._folder = make_owned_folder(RDZV_PREFIX)
        self.log_path = os.path.join(self._folder, "helper.log")
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            self._proc = _spawn(environ, fd)
        finally:
            os.close(fd)
        self._keep_log = False
        self._buffer = b""
        #: a refusal that came while the workers ran (this node evicted)
        self._refusal: str | None = None
        #: when the last news came (time.monotonic()), until the next round read it
        self._news_at: float | None = None
        #: the news that the rendezvous moved (``store moved to node ...``), until read
        self._moved: str | None = None
        #: the last news was nodes waiting to join (:meth:`joining`)
        self._kind: str | None = None
        #: the spare nodes that wait to join, by name, and the node whose link is slow ("":
        #: none) (the rendezvous says them: :meth:`_took_aside`), and the run folder where
        #: they are kept (:meth:`keep_at`)
        self.spares: tuple[str, ...] = ()
        self.slow_link = ""
        self._root: RunFolder | None = None
        self._send(to_line(spec))

    def _send(self, line: bytes) -> None:
        assert self._proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self._proc.stdin.write(line)
            self._proc.stdin.flush()

    def next(self, *, first: bool = True, evict: tuple[str, ...] = (),
             why: str = "") -> Assignment:
        """This node's assignment in the first rendezvous (``first``) or the next round, the
        nodes ``evict`` (identities) left out of it first, for ``why``; a refusal (this node
        evicted, too) or a failure of the helper is a one-line :class:`ConfigError`."""
        if self._refusal is not None:
            raise assignment_of_error(self._refusal)
        if not first:
            self._send(to_line({"next": True, "evict": list(evict), "why": why}))
        line = self._read_line(self.spec.join_timeout + ANSWER_MARGIN)
        while self._took_aside(line) or '"event"' in line:
            if '"event"' in line:  # news read too late to stop the workers: said only
                with contextlib.suppress(ValueError, TypeError, KeyError, OSError,
                                         AttributeError):
                    news = self._note(json.loads(line), line)
                    sys.stderr.write(f"unirank run: {news}\n")
                    sys.stderr.flush()
            line = self._read_line(self.spec.join_timeout + ANSWER_MARGIN)
        try:
            found = assignment_of(line, where="the rendezvous helper")
        except ConfigError as exc:
            if exc.hint:
                raise
            self._keep_log = True
            raise ConfigError(exc.message, variable=exc.variable, value=exc.value,
                              hint=f"the rendezvous helper's log: {self.log_path}") from None
        self.spares = ()  # a new round: none until the rendezvous says so
        self._write_spares()
        return found

    def _read_line(self, timeout: float) -> str:
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            if self._stop_fd is not None:
                selector.register(self._stop_fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                ready = selector.select(left) if left > 0 else []
                if not ready:
                    self._keep_log = True
                    raise ConfigError(
                        f"the rendezvous helper did not answer within {timeout:g} s",
                        hint=f"the rendezvous helper's log: {self.log_path}")
                self._check_stop()
                if all(key.fd != fd for key, _ in ready):
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    self._keep_log = True
                    raise ConfigError(
                        f"the rendezvous helper ended (exit code {self._proc.wait()}) without "
                        "an answer", hint=f"its log: {self.log_path}")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode(errors="replace")

    def _check_stop(self) -> None:
        """Raise :class:`StoppedWaiting` where a signal other than SIGCHLD is on the pipe."""
        if self._stop_fd is None:
            return
        with contextlib.suppress(BlockingIOError):
            for signum in os.read(self._stop_fd, 512):
                if signum != signal.SIGCHLD:
                    raise StoppedWaiting(signum)

    def fileno(self) -> int:
        """The helper's answers: readable when it has news (:meth:`world_change`)."""
        assert self._proc.stdout is not None
        return self._proc.stdout.fileno()

    def world_change(self) -> str | None:
        """The helper's news while the workers run, without blocking: a node lost, nodes
        waiting to join, the store gone, or the helper gone; None when nothing complete
        came."""
        try:
            chunk = os.read(self.fileno(), 65536)
        except BlockingIOError:
            chunk = None
        if chunk == b"":
            self._keep_log, self._kind = True, ENDED
            return f"the rendezvous helper ended (its log: {self.log_path})"
        self._buffer += chunk or b""
        line = b""
        while b"\n" in self._buffer:
            line, _, self._buffer = self._buffer.partition(b"\n")
            if not self._took_aside(line.decode(errors="replace")):
                break
            line = b""
        if not line:
            return None
        try:
            news = json.loads(line)
        except ValueError:
            news = {}
        self._news_at = time.monotonic()
        if not isinstance(news, dict):
            news = {}
        if "error" in news:  # evicted (or the helper gave up): said at the next round
            self._refusal = line.decode(errors="replace")
            self._kind = EVICTED if news.get("exit_code") == EVICTED_EXIT else ENDED
            return str(news["error"])
        return self._note(news, line.decode(errors="replace"))

    def _took_aside(self, line: str) -> bool:
        """Whether ``line`` tells the spares waiting or a slow link (not news: it changes
        nothing for the workers), which are then kept (:meth:`keep_at`); a slow link's line is
        also said (:mod:`.linkrule`)."""
        told = aside_of(line)
        if told is None:
            return False
        with contextlib.suppress(ValueError, TypeError, KeyError):
            if "slow_link" in told:
                sys.stderr.write(f"unirank run: {told['slow_link']}\n")
                sys.stderr.flush()
                self.slow_link = str(told.get("node") or "")
                if self._root is not None:
                    write_slow_link(self._root.slow_link_file, self.slow_link)
            else:
                self.spares = spares_told(told)
                self._write_spares()
        return True

    def keep_at(self, root: RunFolder) -> None:
        """Keep the spares waiting and the slow link in ``root``'s files, now and whenever
        they change (:class:`unirank.supervisor.workerlaunch.WorldWatch`)."""
        self._root = root
        self._write_spares()
        write_slow_link(root.slow_link_file, self.slow_link)

    def _write_spares(self) -> None:
        if self._root is not None:
            write_spares(self._root.spares_file, self.spares)

    def _note(self, news: dict[str, Any], line: str) -> str:
        """The text of ``news`` (a garbled ``line`` as it came); its kind kept
        (:meth:`kind`), and the news itself where the rendezvous moved (:meth:`moved`)."""
        kind = news.get("kind")
        self._kind = kind if isinstance(kind, str) else None
        text = str(news.get("event") or line)
        if self._kind == MOVED:
            self._moved = text
        return text

    def moved(self) -> str | None:
        """The news that the rendezvous moved since the last call (``store moved to node
        node1 (10.0.0.1)``), once; None where it did not."""
        news, self._moved = self._moved, None
        return news

    def kind(self) -> str | None:
        """The kind of the last news (:mod:`.messages`: ``join`` is a change of membership
        alone, which spends no restart), None where it gave none."""
        return self._kind

    def noticed_before(self, began: float) -> float | None:
        """Seconds from the last news (a node lost, joining...) to ``began`` (the next
        round's start), once; None without news."""
        at, self._news_at = self._news_at, None
        return None if at is None else max(0.0, began - at)

    def close(self, *, succeeded: bool = False) -> None:
        """End the helper: its node leaves the rendezvous (and the store it serves ends; where
        the run ``succeeded``, once the other nodes left, :data:`.conf.DRAIN_TIMEOUT` at most)."""
        if succeeded:
            self._send(to_line({"done": True}))
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=CLOSE_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        with contextlib.suppress(OSError):
            if self._keep_log and os.path.getsize(self.log_path) > 0:
                return
        shutil.rmtree(self._folder, ignore_errors=True)


def spares_told(told: Mapping[str, Any]) -> tuple[str, ...]:
    """The spare nodes the rendezvous's ``{"spares": n, "names": [...]}`` tells
    (:meth:`unirank.supervisor.rdzv.keeper.RoundKeeper.say_spares`), by name: "" for each
    whose name is not told (a server that counts them only). ValueError, TypeError or KeyError
    where it is no such line."""
    count = max(int(told["spares"]), 0)
    names = [str(n) for n in told.get("names") or ()][:count]
    return (*names, *("",) * (count - len(names)))


def aside_of(line: str) -> dict[str, Any] | None:
    """The helper's ``line`` where it tells the spares waiting or a slow link (no news: kept
    aside, :meth:`RendezvousHelper._took_aside`), whatever the order of its keys; None for
    any other line (news, a round)."""
    if '"slow_link"' not in line and '"spares"' not in line:
        return None  # the common case, without parsing
    try:
        told = json.loads(line)
    except ValueError:
        return None
    return told if isinstance(told, dict) and {"slow_link", "spares"} & told.keys() else None
