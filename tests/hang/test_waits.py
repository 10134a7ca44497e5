"""A group's last completed collective where torch's flight recorder status stays behind
(:func:`unirank.hang.waits.completed`): gloo's work threads retire collectives out of order,
and the status keeps the number retired last in time. Pure functions, data in; one real
single-rank gloo group checks that the recorder's entries say ``retired``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from unirank.hang.waits import completed, in_flight, retired_through, settle


def entry(seq: int, retired: bool, pg: str = "0", p2p: bool = False) -> dict[str, object]:
    return {"pg_id": pg, "collective_seq_id": seq, "retired": retired, "is_p2p": p2p}


def test_the_entries_say_up_to_where_every_collective_completed() -> None:
    entries = [entry(2, True), entry(3, True), entry(4, True), entry(5, False),
               entry(1, True, pg="1"), entry(7, False, pg="2", p2p=True)]
    assert retired_through(entries) == {"0": 4, "1": 1}
    # one not retired before retired ones: the group completed only up to the one before it
    assert retired_through([entry(3, False), entry(4, True)]) == {"0": 2}
    assert retired_through([{"pg_id": "0"}, "junk"]) == {}  # type: ignore[list-item]


def test_a_status_behind_its_entries_is_moved_up_not_down() -> None:
    # rank 1 entered #5 (a barrier) after #3 and #4 completed; #2's thread retired it last
    assert completed(entered=5, done=2, retired=4) == 4
    assert completed(entered=5, done=4, retired=2) == 4  # entries older than the status
    assert completed(entered=5, done=2, retired=None) == 2
    # a group made again numbers from 1: entries of the old one past it are not taken
    assert completed(entered=2, done=1, retired=9) == 1


def test_a_settled_status_is_no_longer_in_flight() -> None:
    import unirank.hang.waits as waits

    raw = {"0": {"last_enqueued_collective": "4", "last_completed_collective": "2"}}
    assert in_flight(raw)[0]
    waits._RETIRED.clear()
    waits._RETIRED.update(retired_through([entry(3, True), entry(4, True)]))
    try:
        settled = settle(raw)
        assert settled["0"]["last_completed_collective"] == "4"
        assert not in_flight(settled)[0]
        assert raw["0"]["last_completed_collective"] == "2"  # the input is left as it was
    finally:
        waits._RETIRED.clear()


PROGRAM = """
import json, os
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", RANK="0", WORLD_SIZE="1")
import torch, torch.distributed as dist
from unirank.hang.waits import recorder_status, recorder_trace, retired_through
dist.init_process_group("gloo")
import time
for _ in range(3):
    dist.all_reduce(torch.ones(2))
# gloo's work thread marks an entry retired after the caller's wait returned: under load the
# first look can come before it (CI saw {"0": 1}); the entries must say it within the deadline
deadline = time.monotonic() + 60
while True:
    retired = retired_through(recorder_trace()["entries"])
    status = recorder_status(exact=True)
    done = status is not None and status["0"]["last_completed_collective"] == "3"
    if (retired == {"0": 3} and done) or time.monotonic() > deadline:
        break
    time.sleep(0.01)
print(json.dumps(retired))
print(json.dumps(status))
dist.destroy_process_group()
"""


def test_torchs_recorder_entries_say_retired() -> None:
    """What :func:`retired_through` reads is there in this torch: a real gloo group."""
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "16"}
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.splitlines()
    assert json.loads(out[0]) == {"0": 3}
    assert json.loads(out[1])["0"]["last_completed_collective"] == "3"
