"""Signals as unirank's options and variables name them: the one reading of
``unirank run --signals-to-handle``, ``UNIRANK_STOP_SIGNALS`` and ``unirank sbatch --signal``.

A signal is given by name, with or without ``SIG`` and in any case (``USR2``, ``sigterm``), or
by number (``12``; also a real-time signal without a name, 35..63 on Linux). Every use wants a
signal that a program catches and acts on (forwarded to the workers, asking the ranks to stop,
warning them before the time limit), so three are refused everywhere: SIGKILL and SIGSTOP,
which cannot be caught, and SIGCHLD, which the kernel sends whenever a child process ends (a
DataLoader worker, a shell), so that it cannot carry a request.

A refusal is one :class:`~unirank.errors.ConfigError` line naming the option or variable and
the whole text given: ``--signals-to-handle='KILL': SIGKILL cannot be caught HINT: ...``.

Reads no environment variable itself: callers pass the text and say where it came from, or
(:func:`stop_signals`) the mapping to read UNIRANK_STOP_SIGNALS from.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Mapping

from unirank.contract import STOP_SIGNALS_VAR
from unirank.errors import ConfigError

__all__ = ["DEFAULT_WARNING", "FAULT", "FORWARDED", "HANDLED", "HOSTS_STOP", "PID1_PASSED",
           "RANK_STOP", "REFUSED", "SHIELDED", "STOP_SIGNALS", "WARNING", "format_signals",
           "keep_off_new_threads", "parse_signal", "parse_signals",
           "signal_word", "start_shielded", "stop_signals"]

# -- the named signal sets: every part of unirank takes its set from here ---------------------
#
# Which process gets which signal (docs/run.md, docs/slurm-jobs.md say the same):
#
# * ``unirank run`` (the supervisor) handles FORWARDED and passes each to its workers; of them
#   STOP_SIGNALS (SIGTERM, SIGINT, SIGHUP, SIGQUIT) stop the workers, no restart following,
#   and start the grace period (under Slurm, SIGTERM starts none: Slurm's KillWait is it).
# * a rank (``ur.stop_requested()``) is asked to stop by RANK_STOP, or by the set in
#   UNIRANK_STOP_SIGNALS; ``unirank sbatch --signal`` exports it when its warning is not in
#   RANK_STOP, so that the job's warning is always one of the ranks' stop signals.
# * every helper process (fork server, rendezvous helper, stop-report and give-up children,
#   rank 0's store host) ignores SHIELDED: Slurm's ``scancel --signal`` and a time limit's
#   SIGTERM reach every process of a step, and are meant for the program.
# * ``unirank run --hosts`` (the ssh fan-out) stops its hosts on HOSTS_STOP.

#: torchrun's default ``--signals-to-handle`` (TORCHELASTIC_SIGNALS_TO_HANDLE), in its order
HANDLED: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
                                       signal.SIGQUIT)

#: the signals that stop a launcher's workers (after they are forwarded), with a grace period,
#: whatever ``--max-restarts`` is left: torchrun's four, which its agent treats alike (a closed
#: terminal's SIGHUP and a SIGQUIT stop the job as SIGTERM and Ctrl-C do); the launcher then
#: exits 128 + signal (:func:`unirank.exitcodes.killed_by`)
STOP_SIGNALS: tuple[signal.Signals, ...] = HANDLED

#: the signals ``unirank run`` forwards to its workers when ``--signals-to-handle`` is not given:
#: torchrun's, and both user signals: SIGUSR2 is the ranks' default stop signal, and SIGUSR1
#: is the warning most Slurm recipes name (Lightning's ``--signal=USR1@90``), which would
#: otherwise end the launcher by its default action and orphan the job's workers
#: (``unirank.cli.runconfig.run_signals`` adds the set UNIRANK_STOP_SIGNALS names)
FORWARDED: tuple[signal.Signals, ...] = (*HANDLED, signal.SIGUSR1, signal.SIGUSR2)

#: the signals ``unirank run`` as PID 1 of a container passes on to its child (what a container
#: runtime or a terminal sends; :mod:`unirank.supervisor.pidone`)
PID1_PASSED: tuple[signal.Signals, ...] = (
    signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2,
    signal.SIGWINCH, signal.SIGCONT, signal.SIGALRM,
)

#: the signals that ask the ranks to stop (``ur.stop_requested()``) when UNIRANK_STOP_SIGNALS is
#: not set: the default warning, and SIGTERM (how torchrun, Kubernetes, ``unirank run`` and
#: Slurm's end of a run stop a program)
RANK_STOP: tuple[signal.Signals, ...] = (signal.SIGUSR2, signal.SIGTERM)

#: ``unirank sbatch``'s warning before the time limit when ``--signal`` names none (USR2: NCCL
#: may catch USR1)
DEFAULT_WARNING: signal.Signals = signal.SIGUSR2

#: the signals ``unirank sbatch --signal`` may name: each reaches the ranks as a stop signal
#: (exported in UNIRANK_STOP_SIGNALS when not in RANK_STOP), is forwarded by ``unirank run``,
#: and is ignored by every helper. SIGINT is not one: ``unirank run`` gives a forwarded SIGINT a
#: grace period, not Slurm's time to save a checkpoint.
WARNING: tuple[signal.Signals, ...] = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)

#: the signals every helper process ignores (:func:`unirank.supervisor.helper.start_helper`)
#: and rank 0's store host too: the forwarded and stop signals, a terminal's hang-up, quit and
#: job control, and a timer's alarm
SHIELDED: tuple[signal.Signals, ...] = (
    signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
    signal.SIGALRM, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)

#: the signals a worker's death by which shows the Python stack its faulthandler wrote
FAULT: frozenset[int] = frozenset(int(s) for s in (
    signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGFPE, signal.SIGILL))

#: the signals that stop ``unirank run --hosts`` (its ssh clients run in their own session, so
#: the terminal's hang-up must be caught too: SIGHUP is one of the stop signals)
HOSTS_STOP: tuple[signal.Signals, ...] = STOP_SIGNALS

#: the signals no use takes, and why
REFUSED: dict[int, str] = {
    signal.SIGKILL: "cannot be caught",
    signal.SIGSTOP: "cannot be caught",
    signal.SIGCHLD: "is sent whenever a child process ends",
}


def _refusal(what: str, variable: str, value: str, example: str) -> ConfigError:
    return ConfigError(what, variable=variable, value=value,
                       hint="name signals a program can catch (not KILL, STOP or CHLD), by "
                       f"name or number, e.g. {example}")


def _number(word: str) -> int | None:
    """The signal ``word`` names or numbers on this machine, or None."""
    if word.isdigit():
        number = int(word)
        return number if number in signal.valid_signals() else None
    upper = word.upper()
    try:
        return int(signal.Signals[upper if upper.startswith("SIG") else "SIG" + upper])
    except KeyError:
        return None


def parse_signal(word: str, *, variable: str, value: str, example: str) -> int:
    """The number of the one signal ``word`` gives (see the module docstring); a ConfigError
    naming ``variable`` and its whole ``value`` (hint: ``e.g. EXAMPLE``) when it names no
    signal or one that is refused."""
    number = _number(word.strip())
    if number is None:
        raise _refusal("names no signal", variable, value, example)
    if number in REFUSED:
        raise _refusal(f"{signal.Signals(number).name} {REFUSED[number]}", variable, value,
                       example)
    return number


def parse_signals(text: str, *, variable: str, example: str) -> tuple[int, ...]:
    """The signals of a comma- (or space-) separated list, each once, in the order given;
    ``()`` for an empty text. Refusals as :func:`parse_signal`'s."""
    found = [parse_signal(word, variable=variable, value=text, example=example)
             for word in text.replace(" ", ",").split(",") if word]
    return tuple(dict.fromkeys(found))


def stop_signals(environ: Mapping[str, str]) -> tuple[int, ...]:
    """The signals that ask the ranks to stop: UNIRANK_STOP_SIGNALS of ``environ``
    (``USR1,TERM``), else :data:`RANK_STOP` (SIGUSR2 and SIGTERM). The job's warning signal
    (``unirank sbatch --signal``) is always among them. SIGTERM is how torchrun, Kubernetes and
    ``unirank run`` stop their workers, and how Slurm ends a run (scancel, ``scontrol
    requeue``, preemption, the time limit; SIGKILL follows KillWait seconds later): the ranks
    save their checkpoint first, and :func:`unirank.requeue.slurm_run_state` tells a
    requeue from a cancel.

    Reads: UNIRANK_STOP_SIGNALS.
    """
    given = environ.get(STOP_SIGNALS_VAR, "").strip()
    if not given:
        return tuple(int(s) for s in RANK_STOP)
    return parse_signals(given, variable=STOP_SIGNALS_VAR, example="USR2,TERM")


def format_signals(numbers: tuple[int, ...]) -> str:
    """``numbers`` as torchrun's ``--signals-to-handle`` spells them: ``SIGINT,SIGTERM``."""
    return ",".join(signal.Signals(n).name for n in numbers)


def signal_word(number: int) -> str:
    """``number`` as ``kill``, sbatch and UNIRANK_STOP_SIGNALS spell it: ``USR2``, or the
    number of a signal without a name (a real-time one)."""
    try:
        return signal.Signals(number).name.removeprefix("SIG")
    except ValueError:
        return str(number)


#: signals a thread raises itself (a fault in its own code): never blocked
_SYNCHRONOUS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGTRAP,
                signal.SIGSYS, signal.SIGABRT}


def start_shielded(thread: threading.Thread) -> None:
    """Start one of unirank's helper threads with every signal sent to the process blocked from
    its first instruction (it inherits the mask :func:`keep_off_new_threads` sets), so that the
    kernel hands them to the main thread. A signal taken by another thread runs Python's handler
    only when the main thread next runs Python code: a main thread blocked in ``select`` or
    ``read`` would not wake up for it. (Blocking them from inside the thread left a window: under
    load a new thread ran its first line after the program had started waiting, and took the
    signal meant for it.)"""
    with keep_off_new_threads():
        thread.start()


def _asynchronous() -> set[signal.Signals]:
    """The signals sent to a process (every one a thread does not raise itself)."""
    return set(signal.valid_signals()) - _SYNCHRONOUS


@contextlib.contextmanager
def keep_off_new_threads() -> Iterator[None]:
    """Inside, the calling thread blocks every signal sent to the process, so that the threads
    C code starts there inherit that mask (:func:`start_shielded`'s reason): torch's
    thread pool at ``import torch`` and the TCPStore server's loop (``pt_tcpstore_uv``), which a
    worker's bootstrap starts before the program runs, and which would otherwise sometimes take
    a signal meant for the program's main thread. The mask is restored on the way out, where a
    signal that came meanwhile is delivered. Keep inside only what returns at once."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _asynchronous())
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
