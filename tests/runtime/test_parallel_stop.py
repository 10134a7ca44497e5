"""A script that spawns its ranks with ``ur.launch`` (no launcher), stopped by SIGTERM as a
container's PID 1 or a scheduler stops it: the ranks save (``ur.stop_requested()``), and the
script ends with 143 (128 + SIGTERM) after one line, no traceback, as ``unirank run`` does."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from _procs import launcher_free_environ, read_lines

pytestmark = pytest.mark.integration

SCRIPT = """
import sys, time
from pathlib import Path
import unirank as ur

def work(local_rank, out):
    ur.watch_stop_signals()
    print(f"READY {ur.get_rank()}", flush=True)
    while not ur.stop_requested():
        time.sleep(0.02)  # a training step
    Path(out, f"ckpt.{ur.get_rank()}").write_text("saved")

if __name__ == "__main__":
    ur.launch(work, sys.argv[1], nproc_per_node=2)
    print("launch returned", flush=True)
"""


def test_sigterm_stops_a_spawning_script_with_143(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=tmp_path,
                            env=launcher_free_environ(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        read_lines(proc.stdout, 2, contains="READY")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    text = err.decode()
    assert sorted(p.name for p in tmp_path.glob("ckpt.*")) == ["ckpt.0", "ckpt.1"], text
    assert proc.returncode == 143, text
    assert "stopped by SIGTERM (exit code 143)" in text and "Traceback" not in text, text
    assert b"launch returned" not in out
