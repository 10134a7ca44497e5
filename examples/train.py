"""A classic training snippet: one training loop, unchanged under every launcher.

A small CNN learns a random dataset of 3x32x32 images with labels in [0, 100), both made from
``--seed``; ``ur.auto_dataloader``, ``ur.auto_model`` and ``ur.auto_optim`` do the distributed
parts. Every rank logs, every ``--log_interval`` batches, one line::

    Process R/W Train Epoch: E [N/M]	Loss: L

and, at the end, a fingerprint of its parameters (equal on all ranks: the replicas agree).

Run it unchanged with::

    python examples/train.py --nproc_per_node 2                      # spawns 2 local workers
    torchrun --nproc_per_node 2 examples/train.py
    unirank run -n 2 examples/train.py
    srun -N2 --ntasks-per-node=1 python examples/train.py
    sbatch -N2 --ntasks-per-node=1 --wrap "srun python examples/train.py"
    mpirun -np 2 python examples/train.py
    horovodrun --gloo -np 2 -H localhost:2 python examples/train.py   # Horovod
    srun -N2 --ntasks-per-node=1 python examples/train.py --backend horovod
    PJRT_DEVICE=CPU .venv-xla/bin/python examples/train.py --backend xla-tpu   # one XLA device

With ``--checkpoint PATH`` the model, the optimizer and the position (epoch, batch, step and
the world size) are saved (``ur.save``: rank 0, atomically) at the end of every epoch, every
``--save_every`` steps, and when a stop is requested (``ur.stop_requested``: SIGUSR2 to any
rank, SIGTERM outside Slurm) right after the step under way; then ``ur.exit_for_requeue`` ends
the ranks with exit code 79 and, under Slurm, requeues the job. A run that finds the file
resumes at the next step, mid-epoch if need be, with the same data order; ``--epochs`` counts
every epoch, so a resumed run ends where an unbroken one ends (docs/slurm-jobs.md,
"Preemption")::

    unirank sbatch -N 2 --requeue --submit -- examples/train.py --epochs 50 --checkpoint ck.pt

**At a new world size** (an elastic job, ``unirank run --nnodes 1:2 --max-restarts 3``, that
lost a node or admitted one; or any later run with another ``-n``) it resumes the same way and
keeps the **global batch**: ``--batch_size`` is the batch of all ranks together, each rank
loading ``batch_size / world`` of it, and the order of the samples depends on ``--seed`` and the
epoch only (a ``DistributedSampler`` at every world size, 1 included), never on the world
size. So global step ``k`` of an epoch trains on the same samples at any world size, and its
gradient (DDP's mean of the ranks' mean losses) is the mean over the same global batch: a run
resized after step ``k`` goes on with step ``k + 1``, no sample skipped or seen twice, and ends
(within float rounding) where an unbroken run ends. This holds exactly when the world sizes
divide ``--batch_size`` and ``--nb_samples`` (else torch's sampler pads each epoch to a
multiple of the world by repeating its first samples, and the last batch of an epoch is
split unevenly). The steps between the last checkpoint and a failure are done again from the
checkpoint (the model goes back to it, so each counts once): ``--save_every 1`` loses none.
It says so in one line (``ur.elastic_state()``: why the run was restarted)::

    new world size 4 -> 2 (restart 1 of 3, node lost: node2): global batch 16 kept, 8 per rank

The loss is ``CrossEntropyLoss`` on the model's logits: the log-softmax over the classes plus
``NLLLoss`` in one numerically stable step. (A softmax over the *batch* dimension followed by
``NLLLoss``, seen in some snippets, normalises each class's scores across the samples of a batch and
feeds probabilities where log-probabilities are expected.)
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import hashlib
import os
import sys
from typing import Any

import torch
from torch import nn
from torch.utils.data import DistributedSampler, TensorDataset

import unirank as ur

NUM_CLASSES = 100


class SmallCNN(nn.Module):
    """Two convolutions and a linear classifier for 3x32x32 images."""

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(32 * 8 * 8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def random_dataset(nb_samples: int, seed: int) -> TensorDataset:
    """``nb_samples`` random images and labels, the same for a given seed on every rank."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(nb_samples, 3, 32, 32, generator=generator)
    labels = torch.randint(0, NUM_CLASSES, (nb_samples,), generator=generator)
    return TensorDataset(images, labels)


def _unwrapped(model: nn.Module) -> nn.Module:
    inner = getattr(model, "module", model)
    return inner if isinstance(inner, nn.Module) else model


def _resume(checkpoint: str | None, model: nn.Module, optimizer: Any,
            batch_size: int) -> tuple[int, int]:
    """Load the checkpoint if there is one: the epoch and batch to go on from (else 0, 0)."""
    if not checkpoint or not os.path.exists(checkpoint):
        return 0, 0
    state = ur.load(checkpoint)
    _unwrapped(model).load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    epoch, batch = int(state["epoch"]), int(state["batch"])
    ur.print0(f"resumed from {checkpoint} at epoch {epoch}, batch {batch} "
              f"(step {state['step']})", flush=True)
    world, saved_at = ur.get_world_size(), int(state.get("world_size", 0))
    if saved_at and saved_at != world:  # the world changed: say how, and why (if known)
        elastic = ur.elastic_state()
        why = (f"restart {elastic.restart_count} of {elastic.max_restarts}, "
               f"{elastic.reason.describe()}" if elastic.reason else "a new run")
        ur.print0(f"new world size {saved_at} -> {world} ({why}): global batch {batch_size} "
                  f"kept, {batch_size // world if batch_size >= world else batch_size} per rank",
                  flush=True)
    return epoch, batch


def _save(checkpoint: str, model: nn.Module, optimizer: Any, position: dict[str, Any]) -> None:
    """Save what a later run needs to go on exactly from ``position`` (rank 0, atomically)."""
    ur.save({"model": _unwrapped(model).state_dict(), "optimizer": optimizer.state_dict(),
             **position}, checkpoint)


def training(local_rank: int, config: dict[str, Any]) -> None:
    """The training loop (``training``): ``--epochs`` in all, resumed from ``--checkpoint``,
    stopped (checkpoint, then exit for requeue) when a stop is requested."""
    ur.manual_seed(config["seed"])
    dataset = random_dataset(config["nb_samples"], config["seed"])
    rank, world = ur.get_rank(), ur.get_world_size()
    # the order of the samples depends on the seed and the epoch, not on the world size (a
    # DistributedSampler at world 1 too): a run resumed at another world size goes on with
    # the same global batches
    sampler: DistributedSampler[int] = DistributedSampler(
        dataset, num_replicas=world, rank=rank, shuffle=True, seed=config["seed"])
    train_loader = ur.auto_dataloader(dataset, batch_size=config["batch_size"], sampler=sampler)
    model = ur.auto_model(SmallCNN())
    optimizer = ur.auto_optim(torch.optim.SGD(model.parameters(), lr=0.01))
    criterion = nn.CrossEntropyLoss()
    device = ur.device()
    checkpoint = config["checkpoint"]
    first_epoch, first_batch = _resume(checkpoint, model, optimizer, config["batch_size"])
    ur.watch_stop_signals()  # from here a stop signal only sets a flag (see stop_requested)
    steps_per_epoch = len(train_loader)
    stopped_at: dict[str, Any] | None = None
    for epoch in range(first_epoch, config["epochs"]):
        sampler.set_epoch(epoch)  # the shuffle of this epoch
        model.train()
        for batch_idx, (data, target) in enumerate(train_loader):
            if epoch == first_epoch and batch_idx < first_batch:
                continue  # done before the resume: the same order, no step twice
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = criterion(model(data), target)
            loss.backward()
            optimizer.step()
            if batch_idx % config["log_interval"] == 0:
                print(f"Process {rank}/{world} Train Epoch: {epoch} "
                      f"[{batch_idx * len(data)}/{len(train_loader.dataset)}]"  # type: ignore[arg-type]
                      f"\tLoss: {loss.item()}", flush=True)
            position = {"epoch": epoch, "batch": batch_idx + 1, "world_size": world,
                        "step": epoch * steps_per_epoch + batch_idx + 1}
            if ur.stop_requested(every=config["stop_every"]):  # the same step on every rank
                stopped_at = position
                break
            if checkpoint and config["save_every"] and position["step"] % config["save_every"] \
                    == 0 and batch_idx + 1 < steps_per_epoch:  # the epoch's end saves below
                _save(checkpoint, model, optimizer, position)
        if stopped_at is not None:
            break
        if checkpoint:
            _save(checkpoint, model, optimizer, {"epoch": epoch + 1, "batch": 0,
                                                 "world_size": world,
                                                 "step": (epoch + 1) * steps_per_epoch})
    if stopped_at is not None and checkpoint:
        _save(checkpoint, model, optimizer, stopped_at)
        ur.print0(f"stopped at step {stopped_at['step']}: checkpoint saved to {checkpoint}",
                  flush=True)
    else:
        print(f"Process {rank}/{world} parameters {parameters_digest(model)}", flush=True)
    # Free the DDP model while the process group lives: left to interpreter exit, torch 2.13
    # may abort there ("terminate called without an active exception"), pytorch#190489.
    del model, optimizer, train_loader
    gc.collect()
    if stopped_at is not None:
        ur.exit_for_requeue()  # Slurm: requeue the job; every rank exits 79


def parameters_digest(model: nn.Module) -> str:
    """A fingerprint of the parameters' exact bytes: equal on every rank when replicas agree."""
    digest = hashlib.sha256()
    for tensor in _unwrapped(model).state_dict().values():
        flat = tensor.detach().cpu().contiguous()
        digest.update(ctypes.string_at(flat.data_ptr(), flat.numel() * flat.element_size()))
    return digest.hexdigest()[:16]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The training options, plus ``--epochs``, ``--seed`` and ``--checkpoint``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default=None,
                        help="gloo, nccl, horovod, xla-tpu (default: auto: horovod under "
                        "horovodrun, else nccl with a GPU per rank, else gloo)")
    parser.add_argument("--nproc_per_node", "--nproc-per-node", type=int, default=None,
                        help="spawn this many local workers (default: as launched)")
    parser.add_argument("--log_interval", type=int, default=4)
    parser.add_argument("--nb_samples", type=int, default=128)
    parser.add_argument("--batch_size", type=int, default=16, help="over all ranks together")
    parser.add_argument("--epochs", type=int, default=1,
                        help="epochs in all: a resumed run ends where an unbroken one ends")
    parser.add_argument("--stop_every", type=int, default=1,
                        help="ask whether to stop every this many steps (ur.stop_requested)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", default=None, metavar="PATH")
    parser.add_argument("--save_every", type=int, default=0, metavar="STEPS",
                        help="also save the checkpoint every this many steps (0: at each "
                        "epoch's end only)")
    # torch.distributed.launch without --use_env passes --local_rank=N; detection reads it
    parser.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    config = {k: getattr(args, k) for k in ("log_interval", "nb_samples", "batch_size",
                                            "epochs", "seed", "checkpoint", "stop_every",
                                            "save_every")}
    try:
        with ur.Parallel(backend=args.backend or "auto",
                         nproc_per_node=args.nproc_per_node) as parallel:
            parallel.run(training, config)
    except ur.ConfigError as exc:  # a launch mistake: one line that says what to do
        sys.exit(f"train.py: error: {exc}")
