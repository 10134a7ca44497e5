"""Message sizes: ``4K``, ``256M``, ``1G`` (binary units, as nccl-tests reads them), the sweep."""

from __future__ import annotations

import re

from unirank.errors import ConfigError

__all__ = ["UNITS", "human_size", "parse_size", "sweep"]

#: suffix -> multiplier (binary: ``1K`` = 1024 bytes, as nccl-tests' ``-b``/``-e``)
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)\s*", re.IGNORECASE)


def parse_size(text: str, option: str = "size") -> int:
    """Bytes of ``text``: a number with an optional ``K``, ``M``, ``G`` or ``T`` suffix
    (binary, case-insensitive; ``1.5M`` is allowed, the result is truncated to whole bytes).

    Raises :class:`ConfigError` naming ``option`` for anything else, or for zero bytes.
    """
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ConfigError(
            "not a size", variable=option, value=text,
            hint="give bytes with an optional K, M or G suffix (binary: 4K = 4096), e.g. 256M",
        )
    size = int(float(match.group(1)) * UNITS[match.group(2).upper()])
    if size < 1:
        raise ConfigError("a size must be at least 1 byte", variable=option, value=text,
                          hint="e.g. 4K")
    return size


def sweep(min_bytes: int, max_bytes: int, step_factor: int) -> list[int]:
    """The sizes nccl-tests visits: ``min_bytes``, then times ``step_factor`` while
    ``<= max_bytes``."""
    if step_factor < 2:
        raise ValueError("step_factor must be at least 2")
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= step_factor
    return sizes


def human_size(size: int) -> str:
    """``4096`` -> ``4K``, ``1536`` -> ``1.5K``, ``3`` -> ``3`` (binary units, 4 digits; labels)."""
    for suffix in ("T", "G", "M", "K"):
        unit = UNITS[suffix]
        if size >= unit:
            return f"{size / unit:.4g}{suffix}"
    return str(size)
