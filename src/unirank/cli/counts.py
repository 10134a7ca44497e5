"""The counts ``unirank run`` takes: ``--nproc-per-node`` (a number, ``auto``, ``gpu``, ``cpu``)
and ``--nnodes`` (a number, or torchrun's ``N:N``)."""

from __future__ import annotations

from unirank.errors import ConfigError

__all__ = ["parse_nnodes", "parse_nproc"]

_NPROC_HINT = "use a positive integer, 'auto' (GPUs if any, else 1), 'gpu' or 'cpu'"


def parse_nproc(value: str, *, gpu_count: int, cpu_count: int | None) -> int:
    """``--nproc-per-node``: a positive integer, ``auto``, ``gpu`` or ``cpu``.

    ``auto`` is the number of GPUs when there are any, else 1; ``gpu`` is the number of GPUs (an
    error when there are none); ``cpu`` the number of CPUs.
    """
    text = value.strip().lower()
    if text == "auto":
        return gpu_count if gpu_count > 0 else 1
    if text == "gpu":
        if gpu_count <= 0:
            raise ConfigError(
                "asks for one worker per GPU, but no GPU is visible "
                "(CUDA_VISIBLE_DEVICES and /proc/driver/nvidia/gpus show none)",
                variable="--nproc-per-node", value=value,
                hint="give a number of workers, or 'cpu', or run where GPUs are visible",
            )
        return gpu_count
    if text == "cpu":
        return max(1, cpu_count or 1)
    try:
        count = int(text)
    except ValueError:
        raise ConfigError(
            "is not a number of workers", variable="--nproc-per-node", value=value,
            hint=_NPROC_HINT,
        ) from None
    if count < 1:
        raise ConfigError(
            "must be at least 1", variable="--nproc-per-node", value=value, hint=_NPROC_HINT
        )
    return count


def parse_nnodes(value: str) -> int:
    """``--nnodes``: a positive integer (torchrun's ``N:N`` is accepted; elastic ranges are not)."""
    text = value.strip()
    low, sep, high = text.partition(":")
    hint = "give the number of nodes as a positive integer; unirank run is not elastic"
    try:
        count = int(low)
        top = int(high) if sep else count
    except ValueError:
        raise ConfigError("is not a number of nodes", variable="--nnodes", value=value,
                          hint=hint) from None
    if count != top:
        raise ConfigError("is an elastic range, which unirank run does not support",
                          variable="--nnodes", value=value, hint=hint)
    if count < 1:
        raise ConfigError("must be at least 1", variable="--nnodes", value=value, hint=hint)
    return count

