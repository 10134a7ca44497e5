"""words.counted: a printed count agrees with its noun (no "1 workers", no "node(s)")."""

from __future__ import annotations

from unirank.words import counted


def test_one_is_singular_and_every_other_count_plural() -> None:
    assert counted(1, "worker") == "1 worker"
    assert counted(0, "worker") == "0 workers"
    assert counted(2, "rank") == "2 ranks"
    assert counted(1, "process", "processes") == "1 process"
    assert counted(3, "process", "processes") == "3 processes"
