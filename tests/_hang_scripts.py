"""Test programs the hang tests share."""

from __future__ import annotations

__all__ = ["blocked"]


def blocked(report_after: float, timeout: float) -> str:
    """A program for 2+ ranks: ``ur.init`` with the hang keywords given, one all_reduce, then
    rank 1 blocks forever in ``load_next_batch`` while the others wait in the second."""
    return _BLOCKED.replace("REPORT_AFTER", f"{report_after:g}").replace("TIMEOUT",
                                                                         f"{timeout:g}")


_BLOCKED = """import threading

import torch
import torch.distributed as dist
import unirank as ur


def load_next_batch():
    threading.Event().wait()  # blocks forever


ur.init("gloo", hang_report_after=REPORT_AFTER, hang_timeout=TIMEOUT)
t = torch.ones(8)
dist.all_reduce(t)
if dist.get_rank() == 1:
    load_next_batch()
dist.all_reduce(t)  # the all_reduce rank 1 never enters
"""
