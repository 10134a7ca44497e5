"""``unirank top`` on a real ``unirank run`` job (gloo, 2 ranks, the detector's default
settings) from another shell: ``--json`` shows every rank with collective counts rising at
every refresh (the watchers' live records), then marks the rank that stops before its
all_reduce as stuck (SIGTERM then ends it with 0), and follows the job into its next attempt
after a restart; in a real terminal (tmux) the table is drawn in place, marks the stuck rank,
and Ctrl-C ends it with 0, the screen restored.

The script's ranks synchronise through files and a FIFO the test writes, never through sleeps
(the loop's 10 ms pause only paces it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from _procs import Runner

pytestmark = pytest.mark.integration

LOOP = """import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
flag = torch.zeros(1)
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
while True:
    if rank == 1 and attempt == 0 and os.path.exists(os.environ["FAIL_FILE"]):
        sys.exit(1)  # the first attempt fails: unirank run starts the next one
    if rank == 1 and os.path.exists(os.environ["STALL_FILE"]):
        with open(os.environ["RELEASE_FILE"]) as fifo:  # blocks until the test writes
            fifo.read()
        flag += 1
    dist.all_reduce(flag)
    if flag.item() > 0:
        break
    time.sleep(0.01)
dist.destroy_process_group()
"""
TIMEOUT = 90.0


def _top(runner: Runner, *args: str) -> list[str]:
    return [sys.executable, "-m", "unirank", "top", *args]


def _start_job(runner: Runner, tmp_path: Path, job: str, *options: str
               ) -> tuple[subprocess.Popen[Any], Path, Path]:
    runner.script("loop.py", LOOP)
    release, stall = tmp_path / "release", tmp_path / "stall"
    os.mkfifo(release)
    proc = runner.start(["--rdzv-id", job, *options, "-n", "2", "loop.py"],
                        env={"RELEASE_FILE": str(release), "STALL_FILE": str(stall),
                             "FAIL_FILE": str(tmp_path / "fail")})
    return proc, release, stall


def _wait_for_job(runner: Runner, job: str, proc: subprocess.Popen[Any]) -> None:
    """Until ``unirank top --count 1`` finds the job (its job file is written by its first
    rank's watcher: 2 before)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        done = subprocess.run(_top(runner, "--job", job, "--count", "1", "--json"),
                              cwd=runner.cwd, env=runner.environ(), capture_output=True,
                              text=True, timeout=60)
        if done.returncode == 0:
            return
        assert done.returncode == 2 and "no running unirank job" in done.stderr, done.stderr
        assert time.monotonic() < deadline and proc.poll() is None, done.stderr


def _collectives(view: dict[str, Any]) -> list[int | None]:
    return [r["collective"] for r in view["ranks"]]


def _json_view(runner: Runner, job: str) -> subprocess.Popen[str]:
    """``unirank top --job JOB --json`` started, its lines to read."""
    return subprocess.Popen(_top(runner, "--job", job, "--json"), cwd=runner.cwd,
                            env=runner.environ(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_json_shows_every_rank_rising_then_the_stuck_rank(runner: Runner,
                                                          tmp_path: Path) -> None:
    job = f"top-{os.getpid()}"
    proc, release, stall = _start_job(runner, tmp_path, job)
    _wait_for_job(runner, job, proc)
    top = _json_view(runner, job)
    try:
        assert top.stdout is not None
        # live records: every rank's count rises at three refreshes in a row (the progress
        # records alone move once per 5 s interval, never so), and its rate is known
        previous: list[int | None] = [None, None]
        rising = 0
        for line in top.stdout:  # each line a refresh; bounded by the test's timeout
            view = json.loads(line)
            assert view["job"] == job and view["world_size"] == 2
            counts = _collectives(view)
            moved = None not in counts + previous and all(
                c > p for c, p in zip(counts, previous))  # type: ignore[operator]
            rising = rising + 1 if moved else 0
            previous = counts
            if rising >= 3 and all((r["collectives_per_s"] or 0) > 0 for r in view["ranks"]):
                break
        assert rising >= 3, view
        assert {r["node"] for r in view["ranks"]} != {""} and view["ranks"][0]["restarts"] == 0
        stall.touch()  # rank 1 stops before its next all_reduce; rank 0 waits in it
        for line in top.stdout:
            view = json.loads(line)
            if view["stuck"]:
                break
        assert view["stuck"] == [1], view
        states = [r["state"] for r in view["ranks"]]
        assert states == ["waiting", "stuck"], view
        assert "rank 1" in view["notes"][0] and "has not entered it" in view["notes"][0]
        top.terminate()  # SIGTERM ends the view at its next refresh, with 0
        _, err = top.communicate(timeout=TIMEOUT)
        assert top.returncode == 0 and "Traceback" not in err, err
        release.write_text("go")
    finally:
        if top.poll() is None:
            top.kill()
            top.communicate()
    _, job_err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, job_err.decode()


class _Tmux:
    """A tmux server of the test's own (``-L``, its own config), one session."""

    def __init__(self, exe: str, folder: Path, env: dict[str, str]) -> None:
        self.exe, self.socket = exe, f"unirank-top-{uuid.uuid4().hex[:12]}"
        self.config = folder / "tmux.conf"
        self.config.write_text("set -g history-limit 2000\nset -g remain-on-exit on\n")
        self.env = {k: v for k, v in env.items() if k != "TMUX"}
        self.env["TMUX_TMPDIR"] = tempfile.gettempdir()

    def __call__(self, *args: str) -> str:
        done = subprocess.run([self.exe, "-L", self.socket, "-f", str(self.config), *args],
                              env=self.env, capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL, check=False)
        assert done.returncode == 0, f"tmux {' '.join(args)}: {done.stderr}"
        return done.stdout

    def close(self) -> None:
        subprocess.run([self.exe, "-L", self.socket, "kill-server"], env=self.env,
                       capture_output=True, timeout=30, check=False)


def test_a_terminal_shows_one_table_redrawn_in_place_with_the_mark(
        runner: Runner, tmp_path: Path, tmux: str) -> None:
    job = f"topterm-{os.getpid()}"
    proc, release, stall = _start_job(runner, tmp_path, job)
    _wait_for_job(runner, job, proc)
    term = _Tmux(tmux, tmp_path, runner.environ())
    rc = tmp_path / "top.rc"
    script = tmp_path / "top.sh"
    # the shell outlives the Ctrl-C (a trap, not an ignored SIGINT: the view gets the default)
    script.write_text(f"trap : INT\ncd '{runner.cwd}'\necho before the view\n"
                      f"'{sys.executable}' -m unirank top --job {job}\necho $? > '{rc}'\n")
    try:
        term("new-session", "-d", "-s", "top", "-x", "80", "-y", "30", f"sh '{script}'")
        deadline = time.monotonic() + TIMEOUT
        refreshes: set[str] = set()
        screen = ""
        while len(refreshes) < 3:  # three different tables: the numbers move
            assert time.monotonic() < deadline, screen
            screen = term("capture-pane", "-p", "-t", "top")
            if re.search(r"^ +1 .*#\d+", screen, re.M):
                refreshes.add(screen)
            time.sleep(0.2)  # paces the polling of the screen
        assert screen.count("unirank top: job") == 1 and "before the view" not in screen
        history = term("capture-pane", "-p", "-S", "-", "-t", "top")
        assert history.count("unirank top: job") == 1, history  # redrawn, never scrolled
        assert all(len(line) <= 80 for line in screen.splitlines())
        stall.touch()  # rank 1 stops before its all_reduce: marked in the table
        while not re.search(r"^! +1 .* STUCK ", screen, re.M):
            assert time.monotonic() < deadline, screen
            screen = term("capture-pane", "-p", "-t", "top")
            time.sleep(0.2)  # paces the polling of the screen
        assert re.search(r"^ +0 .* waiting ", screen, re.M), screen
        words = " ".join(screen.split())  # the note wrapped to the width
        assert "rank 1 (" in words and "has not entered it" in words, screen
        term("send-keys", "-t", "top", "C-c")
        while not rc.exists() or not rc.read_text().strip():
            assert time.monotonic() < deadline, term("capture-pane", "-p", "-t", "top")
            time.sleep(0.2)  # paces the polling of the file
        after = term("capture-pane", "-p", "-S", "-", "-t", "top")
        assert rc.read_text().strip() == "0", after
        assert "before the view" in after and "unirank top: job" not in after, after
        assert "Traceback" not in after, after
    finally:
        term.close()
        stall.touch()  # rank 1 then reads the FIFO, and the job ends
        release.write_text("go")
    proc.communicate(timeout=TIMEOUT)


def test_json_goes_on_with_the_next_attempt_after_a_restart(runner: Runner,
                                                            tmp_path: Path) -> None:
    """Rank 1 fails (exit 1) in the first attempt; ``--max-restarts 1`` starts the next one:
    the view finds its store from its job file and shows its ranks with one restart."""
    job = f"toprestart-{os.getpid()}"
    proc, release, stall = _start_job(runner, tmp_path, job, "--max-restarts", "1")
    _wait_for_job(runner, job, proc)
    top = _json_view(runner, job)
    try:
        assert top.stdout is not None
        for line in top.stdout:  # bounded by the test's timeout
            view = json.loads(line)
            if None not in _collectives(view):
                break
        assert [r["restarts"] for r in view["ranks"]] == [0, 0], view
        (tmp_path / "fail").touch()
        states: set[str] = set()
        for line in top.stdout:
            view = json.loads(line)
            states.update(r["state"] for r in view["ranks"])
            if [r["restarts"] for r in view["ranks"]] == [1, 1] and None not in _collectives(
                    view):
                break
        assert [r["restarts"] for r in view["ranks"]] == [1, 1], view
        assert "restarting" in states, states  # between the attempts
        stall.touch()
        release.write_text("go")
        _, err = top.communicate(timeout=TIMEOUT)
        assert "looking for its next attempt" in err and f"job {job} ended" in err, err
        assert top.returncode == 0, err
    finally:
        if top.poll() is None:
            top.kill()
            top.communicate()
    _, job_err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, job_err.decode()
