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

Reads no environment variable: callers pass the text and say where it came from.
"""

from __future__ import annotations

import signal

from unirank.errors import ConfigError

__all__ = ["REFUSED", "STOP_SIGNALS", "format_signals", "keep_off_this_thread", "parse_signal",
           "parse_signals"]

#: the signals that stop a launcher's workers (after they are forwarded), with a grace period
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)

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


def format_signals(numbers: tuple[int, ...]) -> str:
    """``numbers`` as torchrun's ``--signals-to-handle`` spells them: ``SIGINT,SIGTERM``."""
    import signal

    return ",".join(signal.Signals(n).name for n in numbers)


#: signals a thread raises itself (a fault in its own code): never blocked
_SYNCHRONOUS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGTRAP,
                signal.SIGSYS, signal.SIGABRT}


def keep_off_this_thread() -> None:
    """Block every signal sent to the process in the calling thread (one of unirank's helper
    threads), so that the kernel hands them to the main thread. A signal taken by another
    thread runs Python's handler only when the main thread next runs Python code: a main thread
    blocked in ``select`` or ``read`` would not wake up for it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, set(signal.valid_signals()) - _SYNCHRONOUS)
