"""``Parallel`` and ``spawn`` with ``init_method="file://FOLDER/<how>"``, two workers each.

Each worker prints ``RESULT how rank world backend store-file`` once its group is up (the store
file exists while the group lives).

Usage: file_init_job.py FOLDER
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import unirank as idist


def report(local_rank: int, how: str, path: str) -> None:
    idist.barrier()
    seen = path if os.path.exists(path) else "missing"
    sys.stdout.write(f"RESULT {how} {idist.get_rank()} {idist.get_world_size()} "
                     f"{idist.backend()} {seen}\n")
    sys.stdout.flush()
    idist.barrier()


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    parallel_store = str(folder / "parallel")
    with idist.Parallel(backend="gloo", nproc_per_node=2,
                        init_method=f"file://{parallel_store}") as parallel:
        parallel.run(report, "parallel", parallel_store)
    spawn_store = str(folder / "spawn")
    idist.spawn("gloo", report, ("spawn", spawn_store), nproc_per_node=2,
                init_method=f"file://{spawn_store}")
