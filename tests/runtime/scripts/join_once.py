"""Under ``unirank run``/``Parallel``: does ``ur.init()`` join again after the bootstrap did?

Prints ``RESULT {json}`` per rank: the bootstrap's join count, whether the first init wrote
join keys of its own, and whether a second init (after finalize) did.
"""

from __future__ import annotations

import datetime
import json
import os

import torch.distributed as dist

import unirank as ur
from unirank.storekeys.init import init_prefix
from unirank.storekeys.join import COUNT_KEY


def joined(generation: int) -> str:
    """The join count's key of ``ur.init``'s ``generation``-th init."""
    return f"{init_prefix(generation)}/join/{COUNT_KEY}"


def main() -> None:
    ur.init("gloo")
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None,
                          False, datetime.timedelta(seconds=60))
    ur.barrier()
    first = store.check([joined(0)])
    bootstrap = int(store.get(COUNT_KEY)) if store.check([COUNT_KEY]) \
        else 0
    ur.finalize()
    ur.init("gloo")
    ur.barrier()
    second = store.check([joined(1)])
    row = {"rank": ur.get_rank(), "bootstrap": bootstrap, "first_init_joined": first,
           "second_init_joined": second}
    print("RESULT " + json.dumps(row), flush=True)
    ur.barrier()
    ur.finalize()


if __name__ == "__main__":
    main()
