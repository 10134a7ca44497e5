"""A stand-in for torch's store, with the few calls the hang detector makes of it (the
detector's unit tests: tests/hang/test_learned_detector.py, test_slow_detector.py)."""

from __future__ import annotations

from typing import Any


class FakeStore:
    """Keys to bytes in a dict; ``add`` counts; ``wait`` notes the keys asked for."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.counts: dict[str, int] = {}
        self.waited: list[str] = []

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.data[key]

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.data[k] for k in keys]

    def add(self, key: str, amount: int) -> int:
        self.counts[key] = self.counts.get(key, 0) + amount
        return self.counts[key]

    def wait(self, keys: list[str], timeout: Any) -> None:
        self.waited = keys
