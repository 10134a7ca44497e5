"""tqdm bars of 1, 2 and 8 ranks under ``unirank run`` in a real terminal emulator (tmux), wide
and narrow, against torchrun's on the same terminal; and in a pipe.

What a terminal keeps is what counts: its scrollback. Bytes alone do not tell it -- tmux
(``scroll-on-clear``) takes an erase-below at the top left of the screen for a clear screen and
pushes the whole screen into the scrollback, so a bar redrawn with ``\\x1b[J`` at the top left
left one line per update there (issue 44: 172 bar lines where torchrun's left 4). So each run
here has a tmux session of its own, started on a cleared screen (the cursor at the top left),
and the bar lines are counted in ``tmux capture-pane -p -J -S -`` (the scrollback too, wrapped
lines joined: a bar's final state wider than a narrow terminal is one line).

tmux runs as a server of its own (``-L``, ``-f`` a config of the test's), so a tmux the user
runs is never touched; a run signals its end with ``tmux wait-for``. tqdm comes with the test
extra (accelerate -> huggingface_hub -> tqdm).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from _procs import Runner

pytestmark = pytest.mark.integration

STEPS = 50
ROWS = 30
#: bar lines unirank's terminal may keep beyond torchrun's (issue 44)
SLACK = 6
# no process group: the bars are the whole run, so both launchers start them the same way
_BARS = f"""
import os, time
from tqdm import tqdm
rank = int(os.environ["RANK"])
for _ in tqdm(range({STEPS}), desc=f"rank{{rank}}", mininterval=0):
    time.sleep(0.02)
"""
_BAR_LINE = re.compile(rf"\b\d+/{STEPS}\b")


class Tmux:
    """A tmux server of the test's own, with a session per command run on it."""

    def __init__(self, exe: str, folder: Path, env: dict[str, str]) -> None:
        self.exe = exe
        self.folder = folder
        self.socket = f"unirank-test-{uuid.uuid4().hex[:12]}"
        self.config = folder / "tmux.conf"
        # the dead pane stays, so that its screen can be read after the command ended
        self.config.write_text("set -g history-limit 20000\nset -g remain-on-exit on\n")
        self.env = {k: v for k, v in env.items() if k != "TMUX"}  # not nested in the user's
        # its socket in the temporary folder the tests clear (not /tmp/tmux-UID), short enough
        # for a unix socket's path
        self.env["TMUX_TMPDIR"] = tempfile.gettempdir()
        self._runs = 0

    def _tmux(self, *args: str, timeout: float = 30.0) -> str:
        done = subprocess.run([self.exe, "-L", self.socket, "-f", str(self.config), *args],
                              env=self.env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)
        assert done.returncode == 0, f"tmux {' '.join(args)}: {done.stderr}"
        return done.stdout

    def run(self, command: list[str], columns: int, timeout: float) -> list[str]:
        """Run ``command`` in a new ``columns`` x :data:`ROWS` session on a cleared screen, to
        its end; the lines the terminal then holds, scrollback included, wrapped ones
        joined."""
        self._runs += 1
        name = f"run{self._runs}"
        rc = self.folder / f"{name}.rc"
        script = self.folder / f"{name}.sh"
        script.write_text(
            f"cd {_quote(self.folder)}\nprintf '\\033[H\\033[2J'\n"  # the top left, as clear
            f"{' '.join(map(_quote, command))}\n"
            f"echo $? > {_quote(rc)}\n"
            f"{_quote(self.exe)} -L {self.socket} wait-for -S {name}\n")
        self._tmux("new-session", "-d", "-s", name, "-x", str(columns), "-y", str(ROWS),
                   f"sh {_quote(script)}")
        try:
            self._tmux("wait-for", name, timeout=timeout)
        except subprocess.TimeoutExpired:
            screen = self._tmux("capture-pane", "-p", "-J", "-S", "-", "-t", name)
            raise AssertionError(f"{command} did not end in {timeout:g} s:\n{screen}") from None
        lines = self._tmux("capture-pane", "-p", "-J", "-S", "-", "-t", name).splitlines()
        assert rc.read_text().strip() == "0", "\n".join(lines)
        return lines

    def close(self) -> None:
        subprocess.run([self.exe, "-L", self.socket, "kill-server"], env=self.env,
                       capture_output=True, timeout=30, check=False)


def _quote(word: object) -> str:
    return "'" + str(word).replace("'", "'\\''") + "'"


@pytest.fixture
def terminal(tmux: str, runner: Runner) -> Iterator[Tmux]:
    made = Tmux(tmux, runner.cwd, runner.environ())
    yield made
    made.close()


def _bar_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if _BAR_LINE.search(line)]


@pytest.mark.parametrize("columns", [100, 40])
@pytest.mark.parametrize("ranks", [1, 2, 8])
def test_a_terminal_keeps_about_as_many_bar_lines_as_torchrun_leaves(
        runner: Runner, terminal: Tmux, ranks: int, columns: int) -> None:
    runner.script("bars.py", _BARS)
    torchrun = _bar_lines(terminal.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={ranks}", "bars.py"], columns, runner.timeout))
    ours = _bar_lines(terminal.run([*runner.command(["-n", str(ranks), "bars.py"])], columns,
                                   runner.timeout))
    print(f"{ranks} ranks, {columns} columns: unirank {len(ours)} bar lines, "
          f"torchrun {len(torchrun)}")
    assert len(ours) <= len(torchrun) + SLACK, "\n".join(ours)
    # every rank's final state stays, once
    for rank in range(ranks):
        final = [line for line in ours if line.startswith(f"rank{rank}: 100%")
                 and f"{STEPS}/{STEPS}" in line]
        assert len(final) == 1, "\n".join(ours)


@pytest.mark.parametrize("ranks", [1, 8])
def test_a_pipe_gets_no_escape_and_a_few_lines_a_bar(runner: Runner, ranks: int) -> None:
    runner.script("bars.py", _BARS)
    result = runner.run(["-n", str(ranks), "bars.py"])
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stderr and "\x1b" not in result.stderr, repr(result.stderr)
    for rank in range(ranks):
        bar = [line for line in result.stderr.splitlines() if line.startswith(f"rank{rank}:")]
        # its first state, one every 5 s at most, its final state: not one a step
        assert 1 <= len(bar) < STEPS // 5, result.stderr
        assert f"{STEPS}/{STEPS}" in bar[-1], result.stderr
