"""The counts ``unirank run`` takes: ``--nproc-per-node`` (a number, ``auto``, ``gpu``, ``cpu``)
and ``--nnodes`` (a number, torchrun's ``N:N``, or an elastic range ``MIN:MAX``)."""

from __future__ import annotations

from unirank.errors import ConfigError

__all__ = ["parse_nnodes", "parse_nnodes_range", "parse_nproc"]

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


def parse_nnodes_range(value: str) -> tuple[int, int]:
    """``--nnodes``: ``N`` or torchrun's ``MIN:MAX`` (``N:N`` is ``N``), as ``(MIN, MAX)``."""
    text = value.strip()
    low, sep, high = text.partition(":")
    hint = "give the number of nodes, N, or an elastic range MIN:MAX"
    try:
        least = int(low)
        most = int(high) if sep else least
    except ValueError:
        raise ConfigError("is not a number of nodes", variable="--nnodes", value=value,
                          hint=hint) from None
    if least < 1:
        raise ConfigError("must be at least 1", variable="--nnodes", value=value, hint=hint)
    if most < least:
        raise ConfigError("has MAX below MIN", variable="--nnodes", value=value, hint=hint)
    return least, most


def parse_nnodes(value: str) -> int:
    """``--nnodes`` of a static rendezvous: a positive integer (torchrun's ``N:N`` is accepted;
    an elastic range needs the c10d rendezvous without ``--node-rank``)."""
    least, most = parse_nnodes_range(value)
    if least != most:
        raise ConfigError(
            "is an elastic range, which needs the dynamic rendezvous", variable="--nnodes",
            value=value, hint="start every node with --rdzv-backend c10d --rdzv-endpoint "
            "HOST:PORT and no --node-rank (nor srun/mpirun), or give one number of nodes")
    return least
