"""One rank of two, as ignite's own test fixtures run it: ``LOCAL_RANK`` and ``WORLD_SIZE`` set,
no ``RANK``, a gloo group made by hand (``init_process_group(rank=r, world_size=2)``), then
every idist call the case list names; then ``RANK`` set late and ``initialize("gloo")`` on a
``file://`` init method. Writes what each call returned (or the exception type it raised) to
``FOLDER/rank<r>.json``.

With ``HIDE_NUMPY=1`` the script runs as if numpy were not installed.

Usage: hand_made_group.py ignite|unirank RANK PORT FOLDER
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

if os.environ.get("HIDE_NUMPY") == "1":
    sys.modules["numpy"] = None  # type: ignore[assignment]  # an import of numpy fails

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

IMPL, RANK, PORT, FOLDER = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
if IMPL == "ignite":
    import ignite.distributed as idist
else:
    import unirank as idist  # type: ignore[no-redef]


class Numbers(Dataset[int]):
    """Ten numbers."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> int:
        return index


def outcome(call: Callable[[], Any]) -> Any:
    """What ``call`` returned (as JSON can hold it), or the name of what it raised."""
    try:
        value = call()
    except Exception as exc:  # the exception's type is the result
        return f"raised {type(exc).__name__}"
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, Path):
        return f"Path({value})"
    return value


def first_locally() -> str:
    with idist.one_rank_first(1, local=True):
        pass
    return "ok"


def loader_facts(**kwargs: Any) -> list[Any]:
    loader = idist.auto_dataloader(Numbers(), **kwargs)
    return [loader.batch_size, loader.num_workers, bool(getattr(loader.sampler, "shuffle", None))]


def hand_made_group(out: dict[str, Any]) -> None:
    """The calls on a group made by hand."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{PORT}", rank=RANK,
                            world_size=2)
    for name in ("get_rank", "get_world_size", "get_local_rank", "get_nproc_per_node",
                 "get_nnodes", "get_node_rank", "backend", "model_name"):
        out[name] = outcome(getattr(idist, name))
    out["one_rank_first_local"] = outcome(first_locally)
    out["gather_str"] = outcome(lambda: idist.all_gather("abc" if RANK == 0 else "de" * 300))
    out["gather_int"] = outcome(lambda: idist.all_gather(10 + RANK))
    out["gather_float"] = outcome(lambda: idist.all_gather(0.5 + RANK))
    out["gather_dict"] = outcome(lambda: idist.all_gather({"r": [RANK]}))
    out["gather_0d"] = outcome(lambda: idist.all_gather(torch.tensor(RANK)))
    out["gather_bad_group"] = outcome(lambda: idist.all_gather(torch.tensor([1]), group="abc"))
    out["reduce_bad_group"] = outcome(lambda: idist.all_reduce(torch.tensor([1]), group="abc"))
    out["reduce_str"] = outcome(lambda: idist.all_reduce("abc"))
    out["reduce_bad_op"] = outcome(lambda: idist.all_reduce(10, op="ABC"))
    out["bcast_str"] = outcome(lambda: idist.broadcast("from 1" if RANK else "", src=1))
    out["bcast_path"] = outcome(lambda: idist.broadcast(Path("/x") if RANK else None, 1, True))
    out["bcast_list"] = outcome(lambda: idist.broadcast([0, 1, 2], src=0))
    out["bcast_none"] = outcome(lambda: idist.broadcast(None, src=0))
    out["new_group_bad"] = outcome(lambda: idist.new_group(["a"]))
    out["loader_bs1"] = outcome(lambda: loader_facts(batch_size=1))
    out["loader_bs5_nw1"] = outcome(lambda: loader_facts(batch_size=5, num_workers=1))
    out["loader_bs8_nw4"] = outcome(lambda: loader_facts(batch_size=8, num_workers=4))
    dist.barrier()
    dist.destroy_process_group()
    if IMPL == "ignite":
        from ignite.distributed.utils import _SerialModel, _set_model

        _set_model(_SerialModel())


def late_environment(out: dict[str, Any]) -> None:
    """``RANK`` set after a first getter call, then ``initialize`` on a ``file://`` store."""
    out["serial_world"] = idist.get_world_size()
    os.environ["RANK"] = str(RANK)
    idist.initialize("gloo", init_method=f"file://{FOLDER}/shared")
    out["late_world"] = [idist.get_rank(), idist.get_world_size(), idist.get_local_rank()]
    out["late_gather"] = idist.all_gather(RANK)
    idist.finalize()


def main() -> None:
    os.environ.pop("RANK", None)
    os.environ["LOCAL_RANK"] = str(RANK)
    os.environ["WORLD_SIZE"] = "2"
    out: dict[str, Any] = {}
    hand_made_group(out)
    late_environment(out)
    (FOLDER / f"rank{RANK}.json").write_text(json.dumps(out, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
