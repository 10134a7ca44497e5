"""Values a library fixes when it is loaded, and how a forked worker gets its own.

A worker forked from the fork server (:mod:`.server`) did not import torch itself: its
libraries read the environment when the server imported them. The server is started with the
environment every worker of its node has in common (:mod:`.client`), so what they read
then is the workers' own, with one exception, :data:`SERVER_ONLY`: OpenBLAS (numpy's, which
torch loads) starts its thread pool at load, and a server must not run a thread when it forks.
The server therefore loads it with one thread, and each worker sets the count its own
environment gives (:func:`apply_worker_values`), as OpenBLAS would have at load:
OPENBLAS_NUM_THREADS, else GOTO_NUM_THREADS, else OMP_NUM_THREADS, else the CPUs this process
may run on, and never more than those CPUs.

torch's own intra-op count (OMP_NUM_THREADS, MKL_NUM_THREADS) is read at import from the common
environment, so it is the workers' own already; its pools start at the first parallel operation,
in the worker.

Random state seeded from the operating system in each process would be the same in every
forked worker, so each worker draws its own numbers as a fresh interpreter does
(:func:`reseed_random_streams`):

* torch's CPU default generator (``torch.rand``, ``randperm``, dropout, a DataLoader's shuffle
  and its workers' seeds) is seeded from the operating system when torch is imported; each
  worker seeds it again the same way (``torch.default_generator.seed()``, not ``torch.seed()``,
  which would also queue ``torch.cuda.manual_seed_all``: a fresh interpreter does not);
* CUDA's generators are left alone: torch creates each one when CUDA is first used, with its
  fixed default seed (``default_rng_seed_val``), in every fresh process; the server never
  initialises CUDA nor queues a CUDA call, so a worker's start as a fresh one's (not checked
  here: this machine has no GPU);
* Python's ``random`` reseeds itself in a forked child (``os.register_at_fork``), ``tempfile``
  makes a new generator when the pid changes, ``uuid.uuid4``, ``secrets`` and numpy's
  ``default_rng()`` read the operating system each time;
* numpy's legacy global generator (``numpy.random.rand``; torch imports numpy) is reseeded;
* ``multiprocessing``'s authentication key (``current_process().authkey``, random per fresh
  interpreter; torch imports multiprocessing) is drawn again.

Python's string hash seed is fixed when an interpreter starts and cannot change afterwards: a
forked worker keeps the server's (docs/run.md lists what a forked worker cannot make identical).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import ctypes

__all__ = ["SERVER_ONLY", "apply_worker_values", "blas_threads", "openblas_thread_count",
           "reseed_random_streams", "set_openblas_threads"]

#: what the server's environment sets besides the workers' common environment
SERVER_ONLY = {"OPENBLAS_NUM_THREADS": "1"}
_COUNT_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
_PREFIXES = ("", "scipy_")
_SUFFIXES = ("", "64_")


def openblas_thread_count(environ: Mapping[str, str]) -> int:
    """The thread count OpenBLAS takes from ``environ`` when it is loaded.

    Reads: OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS, OMP_NUM_THREADS (from ``environ``).
    """
    cpus = len(os.sched_getaffinity(0))
    for name in _COUNT_VARIABLES:
        text = environ.get(name, "").split(",")[0].strip()
        if text.isdigit() and int(text) > 0:
            return min(int(text), cpus)
    return cpus


def _loaded_openblas() -> Iterator[ctypes.CDLL]:
    """The OpenBLAS libraries this process has loaded (numpy's, torch's, scipy's)."""
    import ctypes

    seen: set[str] = set()
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = [line.split(None, 5)[-1].strip() for line in maps]
    except OSError:
        return
    for path in paths:
        if "openblas" in os.path.basename(path).lower() and path not in seen:
            seen.add(path)
            try:
                yield ctypes.CDLL(path)
            except OSError:
                continue


def _function(library: ctypes.CDLL, name: str) -> Any:
    """``name`` in ``library``, under OpenBLAS's plain, 64-bit or scipy-prefixed spelling."""
    for prefix in _PREFIXES:
        for suffix in _SUFFIXES:
            found = getattr(library, f"{prefix}{name}{suffix}", None)
            if found is not None:
                return found
    return None


def blas_threads() -> list[int]:
    """The thread count of each loaded OpenBLAS (what a worker really runs with; the tests
    check :func:`set_openblas_threads` with it)."""
    import ctypes

    counts = []
    for library in _loaded_openblas():
        getter = _function(library, "openblas_get_num_threads")
        if getter is not None:
            getter.restype = ctypes.c_int
            counts.append(int(getter()))
    return counts


def reseed_random_streams() -> None:
    """Seed again, from the operating system, what a fresh interpreter seeds on its own and a
    fork inherits: torch's CPU default generator, numpy's legacy global generator and
    ``multiprocessing``'s authentication key, for those that are loaded (see the module
    docstring)."""
    torch = sys.modules.get("torch")
    generator = getattr(torch, "default_generator", None)
    if generator is not None:
        generator.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
    process = sys.modules.get("multiprocessing.process")
    if process is not None:
        process.current_process().authkey = os.urandom(32)


def apply_worker_values(environ: Mapping[str, str]) -> None:
    """Give each loaded OpenBLAS the thread count ``environ`` asks for, and the random streams
    fresh seeds (see the module docstring).

    Reads: OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS, OMP_NUM_THREADS (from ``environ``).
    """
    reseed_random_streams()
    set_openblas_threads(environ)


def set_openblas_threads(environ: Mapping[str, str]) -> None:
    """Give each loaded OpenBLAS the thread count ``environ`` asks for
    (:func:`openblas_thread_count`).

    Reads: OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS, OMP_NUM_THREADS (from ``environ``).
    """
    import ctypes

    count = openblas_thread_count(environ)
    for library in _loaded_openblas():
        setter = _function(library, "openblas_set_num_threads")
        if setter is not None:
            setter.argtypes = [ctypes.c_int]
            setter(count)
