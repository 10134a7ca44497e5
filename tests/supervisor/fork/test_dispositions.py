"""A forked worker's signal dispositions are those of a child its supervisor exec'ed
(:mod:`unirank.supervisor.fork.dispositions`): the decision checked against a real exec'ed
interpreter, in milliseconds.

Environment variables read: none.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable

from unirank.supervisor.fork.dispositions import after_exec, ignored_here

#: each catchable signal's disposition, as a new interpreter sees it: "ign", "dfl", "int"
_REPORT = """
import json, signal
def name(h):
    return {signal.SIG_IGN: "ign", signal.SIG_DFL: "dfl",
            signal.default_int_handler: "int"}.get(h, repr(h))
print(json.dumps({s: name(signal.getsignal(s)) for s in signal.valid_signals()
                  if s not in (signal.SIGKILL, signal.SIGSTOP)}))
"""


def _named(dispositions: dict[int, object]) -> dict[str, str]:
    names = {signal.SIG_IGN: "ign", signal.SIG_DFL: "dfl", signal.default_int_handler: "int"}
    return {str(s): names[h] for s, h in dispositions.items()}  # type: ignore[index]


def _from_defaults(prepare: Callable[[], None]) -> Callable[[], None]:
    """A child's set-up that puts every signal at its default, not at what this test process
    inherited (a CI job started in the background ignores SIGINT and SIGQUIT), then runs
    ``prepare``."""
    def set_up() -> None:
        for signum in signal.valid_signals():
            if signum not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(signum, signal.SIG_DFL)
        prepare()

    return set_up


def _exec_with(prepare: Callable[[], None]) -> dict[str, str]:
    """What a new interpreter sees when its parent ran ``prepare`` (from the defaults) before
    exec."""
    out = subprocess.run([sys.executable, "-c", _REPORT], preexec_fn=_from_defaults(prepare),
                         capture_output=True, text=True, timeout=60, check=True).stdout
    found: dict[str, str] = json.loads(out)
    return found


def _ignore_int_quit_catch_usr2() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, lambda *_: None)  # caught: exec resets it
    signal.signal(signal.SIGTERM, lambda *_: None)


def test_after_exec_is_what_a_real_exec_gives() -> None:
    ignored = [signal.SIGINT, signal.SIGQUIT]
    assert _named(after_exec(ignored)) == _exec_with(_ignore_int_quit_catch_usr2)
    assert _named(after_exec(())) == _exec_with(lambda: None)


def test_a_default_sigint_raises_keyboard_interrupt_an_ignored_one_stays_ignored() -> None:
    assert after_exec(())[signal.SIGINT] is signal.default_int_handler
    assert after_exec([signal.SIGINT])[signal.SIGINT] == signal.SIG_IGN
    assert after_exec([signal.SIGHUP])[signal.SIGHUP] == signal.SIG_IGN
    assert after_exec([signal.SIGHUP])[signal.SIGTERM] == signal.SIG_DFL
    assert after_exec(())[signal.SIGPIPE] == signal.SIG_IGN  # as Python sets it at start


def test_ignored_here_names_the_ignored_signals_but_python_s_own() -> None:
    code = ("import signal, json\n"
            "from unirank.supervisor.fork.dispositions import ignored_here\n"
            "signal.signal(signal.SIGUSR1, lambda *_: None)\n"
            "print(json.dumps(ignored_here()))")
    out = subprocess.run([sys.executable, "-c", code],
                         preexec_fn=_from_defaults(_ignore_int_quit_catch_usr2),
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(out) == [signal.SIGINT, signal.SIGQUIT]
    assert signal.SIGPIPE not in ignored_here()


def test_apply_sets_every_disposition() -> None:
    code = ("import signal, json\n"
            "from unirank.supervisor.fork.dispositions import after_exec, apply\n"
            "for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):\n"
            "    signal.signal(s, signal.SIG_IGN)\n"
            "apply(after_exec([signal.SIGUSR1]))\n"
            + _REPORT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert json.loads(out) == _named(after_exec([signal.SIGUSR1]))


def test_a_handler_c_code_installed_is_kept() -> None:
    """The interpreter's faulthandler (PYTHONFAULTHANDLER) catches SIGABRT in C; Python sees
    None, and a forked worker keeps it (a fresh one would enable it again)."""
    code = ("import faulthandler, signal\n"
            "from unirank.supervisor.fork.dispositions import after_exec, apply\n"
            "assert signal.getsignal(signal.SIGABRT) is None\n"
            "apply(after_exec(()))\n"
            "assert signal.getsignal(signal.SIGABRT) is None and faulthandler.is_enabled()\n"
            "import os; os.abort()\n")
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == -signal.SIGABRT, proc.stderr
    assert "Fatal Python error: Aborted" in proc.stderr
