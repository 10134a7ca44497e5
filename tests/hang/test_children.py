"""The stacks of a rank's forked children: faulthandler's text parsed (pure), and a real
forked child that blocks is read through the armed signal (Linux)."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from unirank.hang import children

DUMP = """Thread 0x00007f5e (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait
  File "/work/loader.py", line 14 in __getitem__
  File "/usr/lib/python3.11/multiprocessing/process.py", line 108 in run

Current thread 0x00007f5f (most recent call first):
  File "/work/loader.py", line 30 in <module>
"""


def test_parse_dump_gives_each_thread_outermost_first() -> None:
    assert children.parse_dump(DUMP) == [
        [["/usr/lib/python3.11/multiprocessing/process.py", 108, "run", ""],
         ["/work/loader.py", 14, "__getitem__", ""],
         ["/usr/lib/python3.11/threading.py", 327, "wait", ""]],
        [["/work/loader.py", 30, "<module>", ""]]]
    assert children.parse_dump("nothing here") == []


def blocked_child(read_fd: int) -> None:
    os.read(read_fd, 1)  # blocks until the parent writes (or closes)
    os._exit(0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_a_forked_child_is_asked_for_its_stack() -> None:
    assert children.arm()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        blocked_child(read_fd)
    try:
        ready = threading.Event()
        # the child is blocked in os.read once its status shows it sleeping in the kernel
        for _ in range(200):
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().split(") ")[1][0] == "S":
                    ready.set()
                    break
            ready.wait(0.05)
        stacks = children.child_stacks()
        mine = [t for t in stacks if t["ident"] == pid]
        assert mine and any(f[2] == "blocked_child" for f in mine[0]["frames"]), stacks
    finally:
        os.write(write_fd, b"x")
        os.waitpid(pid, 0)
