"""Counting GPUs without torch: CUDA_VISIBLE_DEVICES first, else the NVIDIA driver's /proc files.

The /proc case uses a folder made by the test: this machine has no GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from unirank.supervisor.devices import count_visible_devices, visible_gpu_count


@pytest.mark.parametrize(
    ("value", "count"),
    [("0,1,2", 3), ("", 0), ("-1", 0), ("0,-1,2", 1), ("GPU-aaaa,GPU-bbbb", 2), ("3", 1),
     ("NoDevFiles", 0), ("0,,1", 1)],
)
def test_count_visible_devices(value: str, count: int) -> None:
    assert count_visible_devices(value) == count


def test_visible_gpu_count(tmp_path: Path) -> None:
    for bus in ("0000:01:00.0", "0000:02:00.0"):
        (tmp_path / bus).mkdir()
    assert visible_gpu_count({}, str(tmp_path)) == 2
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": "1"}, str(tmp_path)) == 1
    assert visible_gpu_count({}, str(tmp_path / "absent")) == 0
