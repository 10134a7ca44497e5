"""The hang detector's keywords ``hang_report_after=`` and ``hang_timeout=`` of ``ur.init`` and
``Parallel`` (keywords only), over the variables: real runs where a rank blocks forever in its
own code and the keywords' ``hang_timeout`` ends the job with exit code 86 (``unirank run``,
whose bootstrap's watcher takes ``ur.init``'s keywords; torchrun, where ``ur.init`` starts it;
a ``Parallel`` spawn); the reports name the keywords, not ``unirank run``'s options; bad values
are refused with one line naming the keyword."""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _hang_scripts import blocked
from _procs import Runner, free_port, launcher_free_environ
from unirank.errors import ConfigError
from unirank.runtime.parallel import Parallel

BLOCKED = blocked(1, 2)

PARALLEL = """import threading

import torch
import torch.distributed as dist
import unirank as ur


def body(local_rank):
    t = torch.ones(8)
    dist.all_reduce(t)
    if local_rank == 1:
        threading.Event().wait()  # blocks forever
    dist.all_reduce(t)


if __name__ == "__main__":
    try:
        ur.Parallel("gloo", nproc_per_node=2, hang_report_after=1, hang_timeout=2).run(body)
    except ur.WorkerFailedError as exc:
        print("failed", exc.rank, exc.exitcode)
"""

WAVEFRONT = re.compile(r"^  rank 0 \(\S+\) waits in all_reduce #2 \(float32\[8\], \S+:\d+\) "
                       r"since \d+ s; rank 1 \(\S+\) has not entered it", re.M)


def test_the_keywords_are_keywords_only_and_bad_values_name_them() -> None:
    for function in (Parallel.__init__, __import__("unirank").init):
        params = inspect.signature(function).parameters
        assert params["hang_report_after"].kind is inspect.Parameter.KEYWORD_ONLY
        assert params["hang_timeout"].kind is inspect.Parameter.KEYWORD_ONLY
    with pytest.raises(ConfigError, match="hang_timeout='soon'"):
        Parallel("gloo", nproc_per_node=2, hang_timeout="soon")
    with pytest.raises(ConfigError, match="hang_report_after='-1'"):
        Parallel(hang_report_after=-1)


@pytest.mark.integration
def test_ur_init_keywords_win_over_unirank_runs_settings(runner: Runner) -> None:
    """The bootstrap's watcher started with the default 60 s; ``ur.init``'s keywords make it
    report after 1 s and end the job after 2 s."""
    runner.script("blocked.py", BLOCKED)
    ended = runner.run(["-n", "2", "blocked.py"])
    err = ended.stderr
    assert WAVEFRONT.search(err), err
    assert "ending the job (hang_timeout=2, exit code 86)" in err, err
    assert ended.returncode == 86, err


@pytest.mark.integration
def test_ur_init_keywords_under_torchrun(runner: Runner) -> None:
    torchrun = shutil.which("torchrun")
    assert torchrun, "torchrun comes with torch"
    runner.script("blocked.py", BLOCKED)
    proc = runner.start(command=[torchrun, "--nproc-per-node", "2", "--master-port",
                                 str(free_port()), "blocked.py"])
    _, err_bytes = proc.communicate(timeout=90)
    err = err_bytes.decode()
    assert WAVEFRONT.search(err), err
    assert "ending the job (hang_timeout=2, exit code 86)" in err, err
    assert proc.returncode != 0, err


@pytest.mark.integration
def test_parallel_keywords_reach_the_spawned_workers(tmp_path: Path) -> None:
    (tmp_path / "parallel.py").write_text(PARALLEL)
    ended = subprocess.run([sys.executable, "parallel.py"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=90, env=launcher_free_environ())
    assert WAVEFRONT.search(ended.stderr), ended.stderr
    # the rank blocked in its own code is blamed, not rank 0 that waits for it
    assert ended.stdout == "failed 1 86\n", ended.stdout + ended.stderr
    # the report names the settings as they were given: keywords, not unirank run's options
    assert "ranks have waited in a collective for" in ended.stderr, ended.stderr
    assert "(hang_report_after=1)\n" in ended.stderr, ended.stderr
    assert "  ending the job (hang_timeout=2, exit code 86)\n" in ended.stderr, ended.stderr
    assert "--hang" not in ended.stderr, ended.stderr
