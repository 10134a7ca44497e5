"""Which worker lines are torch's C++ stack dumps (pure: lines in, a verdict out)."""

from __future__ import annotations

from unirank.supervisor.output import StackLines

DUMP = [
    "[rank3]:[W1206 00:47:27.85 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=7)",
    "Exception raised from recvBytes at /torch/csrc/distributed/c10d/Utils.hpp:784 (most "
    "recent call first):",
    "frame #0: c10::Error::Error(c10::SourceLocation) + 0x9d (0x7ffb in libc10.so)",
    "<omitting python frames>",
    "frame #26: _start + 0x21 (0x564a in python3)",
    "",
    "step 3 rank 1 world 2",
    "",
]


def test_a_dump_s_stack_is_picked_not_its_warning_nor_what_follows() -> None:
    stack = StackLines()
    assert [stack.picks(line) for line in DUMP] == [False, True, True, True, True, True, False,
                                                   False]


def test_torch_s_rank_tag_before_a_frame_is_read_through() -> None:
    stack = StackLines()
    assert stack.picks("[rank1]:frame #4: c10d::TCPStore::check() + 0x383")
    assert not stack.picks("Traceback (most recent call last):")
