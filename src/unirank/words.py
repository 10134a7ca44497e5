"""Words in printed text: a count with its noun in agreement (``1 worker``, ``2 workers``).

Pure, torch-free, imported by the parent and the workers alike. Reads no environment
variables."""

from __future__ import annotations


def counted(number: int, noun: str, plural: str | None = None) -> str:
    """``1 worker``, ``0 workers``, ``3 workers``; ``plural`` where adding ``s`` is wrong
    (``counted(2, "process", "processes")``)."""
    return f"{number} {noun if number == 1 else (plural or noun + 's')}"
