"""A group bound by a module imported after it started (:mod:`unirank.runtime.boundworld`):
a real single-rank gloo group, DCP imported after it, ``destroy_process_group()``; the group's
gloo threads are counted by name in ``/proc/self/task``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROGRAM = """
import json, os, sys
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", RANK="0", WORLD_SIZE="1")
import torch.distributed as dist
dist.init_process_group("gloo")
import torch.distributed.checkpoint  # imports torch.distributed.nn.functional, after the group
changed = 0
if sys.argv[1] == "release":
    from unirank.runtime.boundworld import release_bound_world
    changed = release_bound_world()
dist.destroy_process_group()
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print(json.dumps({"changed": changed, "gloo": [n for n in names if "gloo" in n]}))
"""


def _run(mode: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ), check=True)
    return dict(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
def test_a_group_bound_by_a_late_import_ends_with_destroy_once_released() -> None:
    # torch 2.13: the group outlives destroy_process_group (2.9 binds it too, but its
    # destroy_process_group ends the group's threads all the same)
    kept = _run("keep")
    released = _run("release")
    assert released["gloo"] == [], (kept, released)
    if kept["gloo"]:
        assert released["changed"] == 10, (kept, released)


def test_nothing_is_changed_where_the_module_was_imported_before_the_group() -> None:
    import torch.distributed.nn.functional  # noqa: F401  (no group here: its defaults are None)

    from unirank.runtime.boundworld import release_bound_world

    assert release_bound_world() == 0
