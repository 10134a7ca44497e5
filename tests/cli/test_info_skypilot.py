"""``unirank info`` under SkyPilot's variables: every number with its source, against a golden
file (tests/fixtures/info; no SkyPilot cluster runs here, the variables are as its docs give)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from _procs import launcher_free_environ

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "info" / "skypilot_node1.txt"
SKY = {
    "SKYPILOT_NODE_RANK": "1",
    "SKYPILOT_NUM_NODES": "2",
    "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6\n",
    "SKYPILOT_NUM_GPUS_PER_NODE": "0",
    "SKYPILOT_TASK_ID": "sky-2026-11-28-01-02-03-123456_mycluster_7",
}


def info_report(extra: dict[str, str]) -> str:
    """``unirank info`` under ``extra`` (no other launcher's variables), less the cpus line."""
    out = subprocess.run([sys.executable, "-m", "unirank", "info"],
                         env=launcher_free_environ(extra), capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return "".join(line for line in out.splitlines(keepends=True)
                   if not line.startswith("  cpus "))


def test_info_under_skypilot_matches_golden_file() -> None:
    report = info_report(SKY)
    assert report == GOLDEN.read_text(), (
        f"differs from {GOLDEN.name}; regenerate: see tests/fixtures/info/README.md")
