"""A test hook for tests/integration/test_preemption.py, inert unless UNIRANK_TEST_HOLD_AT is set.

The test puts this folder first on PYTHONPATH, so every Python process of the run imports it at
start-up. On a first run (the checkpoint named by UNIRANK_TEST_HOLD_CHECKPOINT did not exist at
the first ask), the UNIRANK_TEST_HOLD_AT-th call of ``unirank.stop_requested`` holds the
training there: rank 0 prints ``HOLDING``, then every rank keeps asking the real
``stop_requested`` (one collective per ask, the same fixed number of asks on every rank, so the
ranks stay in step) until a stop is requested. A stop signal that the test sends once it reads
``HOLDING`` therefore always lands mid-run, whatever the machine's load. A resumed run does not
hold.

Reads: UNIRANK_TEST_HOLD_AT, UNIRANK_TEST_HOLD_CHECKPOINT.
"""

from __future__ import annotations

import os

#: asks while holding (about 0.02 s apart): the hold ends after about two minutes at most
HOLD_ASKS = 6000


def _install(hold_at: int, checkpoint: str) -> None:
    import time

    import unirank

    calls = [0]
    first_run: list[bool] = []

    def held(every: int = 1, time_margin: float | None = None) -> bool:
        from unirank.runtime.preemption import stop_requested

        calls[0] += 1
        if not first_run:
            first_run.append(not os.path.exists(checkpoint))
        if calls[0] != hold_at or not first_run[0]:
            return stop_requested(every, time_margin)
        if unirank.get_rank() == 0:
            print("HOLDING", flush=True)
        for _ in range(HOLD_ASKS):
            if stop_requested(1, time_margin):
                return True
            time.sleep(0.02)
        return False

    unirank.stop_requested = held  # type: ignore[assignment]


if os.environ.get("UNIRANK_TEST_HOLD_AT", "").isdigit():
    _install(int(os.environ["UNIRANK_TEST_HOLD_AT"]),
             os.environ.get("UNIRANK_TEST_HOLD_CHECKPOINT", ""))
