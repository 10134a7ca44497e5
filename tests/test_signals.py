"""The one reading of signal names and numbers (unirank.signals), and its three users giving the
same answer: ``unirank run --signals-to-handle``, ``UNIRANK_STOP_SIGNALS`` (what the ranks stop
on) and ``unirank sbatch --signal`` (the warning before the time limit)."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Callable

import pytest

from unirank import signals as S
from unirank.cli.main import build_parser, main
from unirank.cli.run import engine_options
from unirank.errors import ConfigError
from unirank.signals import format_signals, parse_signal, parse_signals, stop_signals

REPO = Path(__file__).resolve().parents[1]
HELLO = "examples/helloworld.py"


def _run_option(text: str) -> tuple[int, ...]:
    """What ``unirank run --signals-to-handle TEXT`` forwards."""
    args = build_parser("run").parse_args(["run", "--signals-to-handle", text, "x.py"])
    return engine_options(args).signals


def _stop_variable(text: str) -> tuple[int, ...]:
    """What the ranks stop on with ``UNIRANK_STOP_SIGNALS=TEXT``."""
    return stop_signals({"UNIRANK_STOP_SIGNALS": text})


def _sbatch_option(text: str) -> tuple[int, ...]:
    """The signal ``unirank sbatch --signal B:TEXT`` has the batch shell pass on (the script's
    ``kill -NAME`` or ``kill -NUMBER``)."""
    args = build_parser("sbatch").parse_args(["sbatch", "--signal", f"B:{text}", HELLO])
    from unirank.cli.sbatch import build_spec
    from unirank.sbatch.spec import signal_for_batch_shell

    shell = signal_for_batch_shell(build_spec(args).signal or "")
    assert shell is not None
    return (int(shell) if shell.isdigit() else int(signal.Signals["SIG" + shell]),)


ENTRY_POINTS: dict[str, tuple[Callable[[str], tuple[int, ...]], str]] = {
    "run": (_run_option, "--signals-to-handle='{}'"),
    "stop": (_stop_variable, "UNIRANK_STOP_SIGNALS='{}'"),
    "sbatch": (_sbatch_option, "--signal='B:{}'"),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize(("text", "number"), [("12", 12), ("usr2", 12), ("SIGUSR2", 12),
                                              ("40", 40)])
def test_names_and_numbers_are_taken_by_every_use(entry: str, text: str, number: int) -> None:
    """"12" was refused by ``unirank run`` alone; 40 is a real-time signal without a name,
    which cannot be a job's warning (:data:`unirank.signals.WARNING`)."""
    read, variable = ENTRY_POINTS[entry]
    if entry == "sbatch" and number not in S.WARNING:
        with pytest.raises(ConfigError, match=f"^{re.escape(variable.format(text))}: "
                           f"{text} cannot be the job's warning"):
            read(text)
        return
    assert read(text) == (number,)


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize(("text", "reason"), [
    ("KILL", "SIGKILL cannot be caught"),
    ("sigstop", "SIGSTOP cannot be caught"),
    ("CHLD", "SIGCHLD is sent whenever a child process ends"),
    ("USR3", "names no signal"),
    ("0", "names no signal"),
    ("65", "names no signal"),
])
def test_every_use_refuses_the_same_with_one_line(entry: str, text: str, reason: str) -> None:
    """KILL was taken by ``unirank sbatch`` alone, CHLD refused by ``unirank run`` alone."""
    read, variable = ENTRY_POINTS[entry]
    with pytest.raises(ConfigError) as caught:
        read(text)
    line = str(caught.value)
    assert line.startswith(f"{variable.format(text)}: {reason} HINT: name signals a program "
                           "can catch (not KILL, STOP or CHLD), by name or number, e.g. "), line
    assert "\n" not in line


def test_sbatch_refuses_an_uncaught_warning_with_its_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    assert main(["sbatch", "--signal", "KILL@60", HELLO]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", "unirank sbatch: error: --signal='KILL@60': SIGKILL cannot be "
                          "caught HINT: name signals a program can catch (not KILL, STOP or "
                          "CHLD), by name or number, e.g. USR2@120\n")


def test_a_list_keeps_the_order_given_each_signal_once() -> None:
    assert parse_signals(" usr1, SIGTERM,USR1 2", variable="V", example="E") == (
        signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)
    assert parse_signals("", variable="V", example="E") == ()
    with pytest.raises(ConfigError, match=r"^V='TERM,KILL': SIGKILL cannot be caught"):
        parse_signals("TERM,KILL", variable="V", example="E")
    assert parse_signal(" Term ", variable="V", value="x", example="E") == signal.SIGTERM


def test_format_signals_spells_them_as_torchrun_s_option() -> None:
    assert format_signals((signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)) == \
        "SIGTERM,SIGINT,SIGUSR1"
    assert format_signals(()) == ""


# --- the named sets: one home, and what they must hold for each other -----------------------


def test_the_job_s_warning_reaches_ranks_through_unirank_run_and_past_every_helper() -> None:
    """A warning signal ``unirank sbatch`` accepts is forwarded by ``unirank run`` (--launch
    node), ignored by every helper (Slurm sends it to every process of the step), and either
    a default stop signal of the ranks or exported as one (tests/sbatch), which ``unirank run``
    then forwards besides torchrun's set."""
    from unirank.cli.runconfig import run_signals
    from unirank.contract import STOP_SIGNALS_VAR

    for warning in S.WARNING:
        exported = {STOP_SIGNALS_VAR: f"{warning.name},TERM"}
        assert int(warning) in run_signals(None, exported)[0]
    assert set(S.RANK_STOP) <= set(S.FORWARDED)
    assert set(S.HANDLED) <= set(S.FORWARDED)
    assert set(S.WARNING) <= set(S.SHIELDED)
    assert S.DEFAULT_WARNING in S.WARNING and S.DEFAULT_WARNING in S.RANK_STOP
    assert signal.SIGINT not in S.WARNING  # unirank run gives SIGINT a grace period
    assert set(S.RANK_STOP) <= set(S.SHIELDED) and set(S.FORWARDED) <= set(S.SHIELDED)
    assert set(S.STOP_SIGNALS) <= set(S.FORWARDED) and set(S.STOP_SIGNALS) <= set(S.HOSTS_STOP)
    assert not set(S.SHIELDED) & set(S.REFUSED)
    assert stop_signals({}) == tuple(S.RANK_STOP)


def test_no_module_but_signals_py_spells_out_a_set_of_signals() -> None:
    """Every named signal set lives in unirank.signals (issue 33: they were in seven places,
    and the job's warning was in none of the ranks')."""
    literal = re.compile(r"[(\[{]\s*signal\.SIG[A-Z0-9]+\s*,\s*signal\.SIG[A-Z]")
    found = [str(path.relative_to(REPO)) for path in (REPO / "src").rglob("*.py")
             if path.name != "signals.py" and literal.search(path.read_text())]
    assert found == []


def test_a_shielded_thread_blocks_the_program_s_signals_from_its_first_line() -> None:
    """A helper thread is born with the process's signals blocked (a thread that blocked them
    itself took, under load, a signal sent before its first line ran), and the starting
    thread's own mask is the same afterwards."""
    import threading

    from unirank.signals import start_shielded

    seen: list[set[signal.Signals]] = []
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    thread = threading.Thread(target=lambda: seen.append(
        signal.pthread_sigmask(signal.SIG_BLOCK, [])))
    start_shielded(thread)
    thread.join(10)
    assert {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1} <= seen[0]
    assert signal.SIGSEGV not in seen[0]
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
