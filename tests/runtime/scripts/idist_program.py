"""One small idist program that calls every public name of ``ignite.distributed``.

``IDIST_IMPL=ignite`` runs it with ``import ignite.distributed as idist``, ``IDIST_IMPL=unirank``
with ``import unirank as idist``; nothing else changes. Each rank writes ``OUT/rank<r>.json``:
what every call returned (tensors as ``{"tensor": values, "dtype": ...}``).

Usage: python idist_program.py MODE OUT
  MODE parallel: ``with idist.Parallel(backend="gloo", nproc_per_node=2) as p: p.run(...)``
  MODE spawn:    ``idist.spawn("gloo", body, (OUT,), nproc_per_node=2)``
  MODE torchrun: under ``torchrun --nproc_per_node 2``: initialize, body, finalize
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import SequentialSampler

if os.environ["IDIST_IMPL"] == "ignite":
    import ignite.distributed as idist
else:
    import unirank as idist


def plain(value: Any) -> Any:
    """``value`` as JSON-ready data, keeping what tells two results apart."""
    if isinstance(value, torch.Tensor):
        return {"tensor": value.tolist(), "dtype": str(value.dtype), "device": value.device.type}
    if isinstance(value, Path):
        return {"path": str(value)}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, (list, tuple)):
        return {"seq": type(value).__name__, "items": [plain(item) for item in value]}
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    return value


def logged(call: Callable[[], None]) -> list[str]:
    """The messages of every record logged (by any logger) while ``call`` runs."""
    messages: list[str] = []
    original = logging.Logger.handle

    def handle(self: logging.Logger, record: logging.LogRecord) -> Any:
        messages.append(record.getMessage())
        return original(self, record)

    logging.Logger.handle = handle  # type: ignore[method-assign]
    try:
        call()
    finally:
        logging.Logger.handle = original  # type: ignore[method-assign]
    return messages


def getters(out: dict[str, Any]) -> None:
    out["model_name"] = idist.model_name()
    out["backend"] = idist.backend()
    out["device"] = idist.device()
    out["world_size"] = idist.get_world_size()
    out["rank"] = idist.get_rank()
    out["local_rank"] = idist.get_local_rank()
    out["nproc_per_node"] = idist.get_nproc_per_node()
    out["nnodes"] = idist.get_nnodes()
    out["node_rank"] = idist.get_node_rank()
    out["hostname"] = idist.hostname()
    out["available_backends"] = idist.available_backends()
    out["flags"] = [idist.has_native_dist_support, idist.has_hvd_support, idist.has_xla_support]


def reductions(out: dict[str, Any], rank: int) -> None:
    out["reduce_tensor"] = idist.all_reduce(torch.tensor([rank + 1.0]))
    out["reduce_int"] = idist.all_reduce(rank + 1)
    out["reduce_float_max"] = idist.all_reduce(rank + 0.5, "MAX")
    out["reduce_min"] = idist.all_reduce(torch.tensor([rank, 10 - rank]), op="MIN")
    out["reduce_product"] = idist.all_reduce(torch.tensor([rank + 2.0]), "PRODUCT")
    out["reduce_and"] = idist.all_reduce(torch.tensor([rank + 1, 3]), "AND")
    out["reduce_or"] = idist.all_reduce(torch.tensor([rank + 1, 4]), "OR")
    out["reduce_group_list"] = idist.all_reduce(torch.tensor([rank + 1.0]), "SUM", [0, 1])
    solo = idist.new_group([0])
    out["new_group"] = type(idist.new_group([0, 1])).__name__
    out["reduce_solo"] = idist.all_reduce(torch.tensor([rank + 1.0]), group=solo)
    out["gather_solo"] = idist.all_gather(torch.tensor([rank]), group=solo)


def gathers(out: dict[str, Any], rank: int, world: int) -> None:
    out["gather_tensor"] = idist.all_gather(torch.tensor([rank, 10 * rank]))
    out["gather_0d"] = idist.all_gather(torch.tensor(rank))
    out["gather_int"] = idist.all_gather(rank)
    out["gather_float"] = idist.all_gather(rank * 0.5)
    out["gather_str"] = idist.all_gather("r" * (rank + 1))
    out["gather_obj"] = idist.all_gather({"rank": rank})
    out["gather_group_list"] = idist.all_gather(torch.tensor([rank]), group=[0, 1])
    out["gather_shapes"] = idist.all_gather_tensors_with_shapes(
        torch.full((rank + 1, rank + 2), float(rank)), [[r + 1, r + 2] for r in range(world)])


def broadcasts(out: dict[str, Any], rank: int) -> None:
    out["bcast_tensor"] = idist.broadcast(torch.tensor([float(rank)] * 2), src=1)
    out["bcast_float"] = idist.broadcast(rank + 2.5, src=1)
    out["bcast_str"] = idist.broadcast(f"from {rank}", src=1)
    out["bcast_path"] = idist.broadcast(Path(f"/data/r{rank}"), src=1)
    out["bcast_safe_tensor"] = idist.broadcast(
        torch.arange(3) if rank == 0 else None, src=0, safe_mode=True)
    out["bcast_safe_str"] = idist.broadcast("zero" if rank == 0 else None, 0, True)
    idist.barrier()


def helpers(out: dict[str, Any], rank: int, folder: str) -> None:
    out["one_rank_only"] = idist.one_rank_only(1, True)(lambda: f"ran on {rank}")()
    with idist.one_rank_first(0, local=True):
        out["one_rank_first_saw"] = sorted(n for n in os.listdir(folder) if n.startswith("first"))
        Path(folder, f"first{rank}").touch()
    model = idist.auto_model(torch.nn.Linear(2, 2))
    out["auto_model"] = type(model).__name__
    out["auto_optim"] = type(idist.auto_optim(torch.optim.SGD(model.parameters(), lr=0.1))).__name__
    del model  # a DDP model is freed while the group lives
    loader = idist.auto_dataloader(list(range(8)), batch_size=4, shuffle=True)
    out["auto_dataloader"] = [batch for batch in loader]
    out["proxy_sampler"] = list(idist.DistributedProxySampler(SequentialSampler(range(8))))
    idist.sync()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idist.set_local_rank(idist.get_local_rank())
    out["local_rank_after_set"] = idist.get_local_rank()
    out["show_config"] = logged(idist.show_config)


def body(local_rank: int, folder: str) -> None:
    """Every name, once; this rank's results go to ``folder/rank<r>.json``."""
    rank, world = idist.get_rank(), idist.get_world_size()
    out: dict[str, Any] = {"local_rank_arg": local_rank}
    getters(out)
    reductions(out, rank)
    gathers(out, rank, world)
    broadcasts(out, rank)
    helpers(out, rank, folder)
    Path(folder, f"rank{rank}.json").write_text(json.dumps(plain(out), indent=1, sort_keys=True))


def main() -> None:
    mode, folder = sys.argv[1], sys.argv[2]
    if mode == "parallel":
        with idist.Parallel(backend="gloo", nproc_per_node=2) as parallel:
            parallel.run(body, folder)
    elif mode == "spawn":
        idist.spawn("gloo", body, (folder,), nproc_per_node=2)
    elif mode == "torchrun":
        before = idist.model_name()
        idist.initialize("gloo")
        rank = idist.get_rank()
        body(idist.get_local_rank(), folder)
        idist.finalize()
        lifecycle = {"before": before, "after": idist.model_name()}
        Path(folder, f"lifecycle{rank}.json").write_text(json.dumps(lifecycle))
    else:
        raise SystemExit(f"unknown mode {mode!r}: use parallel, spawn or torchrun")


if __name__ == "__main__":
    main()
