"""auto_model, auto_optim, manual_seed, save and load: in this process without a process group
(world size 1, or a launcher's world without a group), and with real gloo groups in fresh
processes (a group of one, and two workers spawned by Parallel)."""

from __future__ import annotations

import fractions
import os
import pickle
import random
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch

import unirank as ur
from _procs import run_job
from unirank.distenv import DistEnv
from unirank.runtime import state, training

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def test_auto_model_at_world_one_returns_the_same_module_on_the_device(serial: DistEnv) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    assert ur.auto_model(model) is model
    assert all(p.device == torch.device("cpu") for p in model.parameters())
    # sync_bn needs nothing to synchronise at world size 1: the BatchNorm stays
    assert ur.auto_model(model, sync_bn=True) is model
    assert type(model[1]) is torch.nn.BatchNorm1d


def test_auto_model_leaves_a_data_parallel_model_alone(serial: DistEnv) -> None:
    wrapped = torch.nn.DataParallel(torch.nn.Linear(2, 2))
    assert ur.auto_model(wrapped) is wrapped


def test_auto_model_at_a_larger_world_needs_a_process_group(use_env: None) -> None:
    state.set_dist_env(DistEnv(launcher="torchrun", rank=1, local_rank=1, world_size=2,
                               local_world_size=2))
    with pytest.raises(RuntimeError, match=r"needs a process group .* 2 processes: call ur.init"):
        ur.auto_model(torch.nn.Linear(2, 2))


class RecordingModule(torch.nn.Linear):
    """A Linear that records the device it is sent to instead of moving (no CUDA here)."""

    def __init__(self) -> None:
        super().__init__(2, 2)
        self.sent_to: list[torch.device] = []

    def to(self, *args: Any, **kwargs: Any) -> RecordingModule:  # type: ignore[override]
        self.sent_to.append(args[0])
        return self


def test_auto_model_on_cuda_gives_ddp_the_device_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mocked, because it needs a GPU: this rank's device is cuda:1 in a world of 2 with a group,
    and DistributedDataParallel is a recorder (a CUDA DDP cannot be built without CUDA)."""
    monkeypatch.setattr(state, "device", lambda: torch.device("cuda:1"))
    monkeypatch.setattr(state, "is_initialized", lambda: True)
    monkeypatch.setattr(state, "backend_entry", lambda: None)
    monkeypatch.setattr(state, "get_world_size", lambda: 2)
    built: list[tuple[Any, dict[str, Any]]] = []
    monkeypatch.setattr(training, "DistributedDataParallel",
                        lambda model, **kwargs: built.append((model, kwargs)) or "ddp")
    model = RecordingModule()
    assert ur.auto_model(model, broadcast_buffers=False) == "ddp"
    assert model.sent_to == [torch.device("cuda:1")]
    assert built == [(model, {"broadcast_buffers": False, "device_ids": [1]})]
    ur.auto_model(RecordingModule(), device_ids=[0])  # the user's own device_ids win
    assert built[-1][1] == {"device_ids": [0]}


def test_auto_optim_returns_the_optimizer_without_a_backend_hook(serial: DistEnv) -> None:
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    assert ur.auto_optim(optimizer) is optimizer
    assert ur.auto_optim(optimizer, backward_passes_per_step=2) is optimizer


def draws() -> tuple[float, float, float]:
    return random.random(), float(numpy.random.rand()), torch.rand(1).item()


def test_manual_seed_seeds_random_numpy_and_torch(serial: DistEnv) -> None:
    assert ur.manual_seed(11) == 11
    first = draws()
    ur.manual_seed(11)
    assert draws() == first
    ur.manual_seed(12)
    assert all(a != b for a, b in zip(draws(), first))


def test_manual_seed_per_rank_adds_the_global_rank(use_env: None) -> None:
    state.set_dist_env(DistEnv(launcher="slurm", rank=3, world_size=4))
    assert ur.manual_seed(11, per_rank=True) == 14
    per_rank = draws()
    assert ur.manual_seed(11) == 11
    ur.manual_seed(14)
    assert draws() == per_rank
    assert ur.manual_seed(2**32 + 1) == 2**32 + 1  # numpy's 32-bit limit is taken modulo


def test_save_writes_atomically_and_load_reads_it_back(serial: DistEnv, tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pt"
    old_umask = os.umask(0o022)
    try:
        ur.save({"weights": torch.arange(3.0), "epoch": 2}, path)
    finally:
        os.umask(old_umask)
    assert os.listdir(tmp_path) == ["ckpt.pt"]
    assert path.stat().st_mode & 0o777 == 0o644  # the umask's mode, not a temporary file's 0600
    loaded = ur.load(path)
    assert loaded["epoch"] == 2
    assert loaded["weights"].tolist() == [0.0, 1.0, 2.0]
    assert loaded["weights"].device == torch.device("cpu")
    ur.save({"epoch": 3}, str(path))  # replaces the file
    assert ur.load(str(path)) == {"epoch": 3}
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def test_a_failed_save_keeps_the_old_file_and_leaves_no_temporary(
    serial: DistEnv, tmp_path: Path
) -> None:
    path = tmp_path / "ckpt.pt"
    ur.save({"epoch": 1}, path)
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        ur.save({"epoch": 2, "fn": lambda: None}, path)
    assert os.listdir(tmp_path) == ["ckpt.pt"]
    assert ur.load(path) == {"epoch": 1}
    with pytest.raises(FileNotFoundError, match="no such folder to save into"):
        ur.save({}, tmp_path / "missing" / "ckpt.pt")


def test_load_uses_torchs_weights_only_default(serial: DistEnv, tmp_path: Path) -> None:
    path = tmp_path / "obj.pt"
    ur.save({"ratio": fractions.Fraction(1, 3)}, path)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        ur.load(path)
    assert ur.load(path, weights_only=False) == {"ratio": fractions.Fraction(1, 3)}


@pytest.mark.integration
def test_a_group_of_one_leaves_models_unwrapped_and_backend_hooks_replace_the_steps() -> None:
    """A real gloo group of one (fresh process); the gloo entry is replaced by one with hooks."""
    (result,) = run_job(SCRIPTS / "world_one_job.py")
    assert (result["world"], result["backend"]) == (1, "gloo")
    assert result["plain_same"] and result["ddp_same"]
    assert result["hooked"] == ["hooked model", "hooked optimizer", "hooked loader"]
    assert result["calls"] == [
        ["model", "Linear", "cpu", True, ["bucket_cap_mb"]],
        ["optimizer", "SGD", ["backward_passes_per_step"]],
        ["loader", "AutoDataLoader", 2],
    ]
    assert result["optim_inner"]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """What each of 2 real gloo workers (spawned by Parallel) saw in scripts/training_job.py."""
    results = run_job(SCRIPTS / "training_job.py", str(tmp_path_factory.mktemp("ckpt")))
    assert [r["rank"] for r in results] == [0, 1]
    return results


@pytest.mark.integration
def test_auto_model_wraps_in_ddp_and_averages_gradients(two_ranks: list[dict[str, Any]]) -> None:
    first, second = two_ranks
    for r in two_ranks:
        assert r["wrapped"] == "DistributedDataParallel"
        assert r["module_is_plain"] and r["not_rewrapped"] and r["optim_unchanged"]
    # DDP started both replicas from rank 0's weights, though each rank initialised its own
    assert first["start"] == second["start"]
    # each rank's gradient is the mean of the gradients the two ranks' data give alone
    for index in range(2):
        alone = [first["alone_grads"][index], second["alone_grads"][index]]
        mean = torch.tensor(alone).mean(dim=0)
        for r in two_ranks:
            assert torch.allclose(torch.tensor(r["grads"][index]), mean)
    assert first["alone_grads"] != second["alone_grads"]  # the data really differed
    assert first["after_step"] == second["after_step"]


@pytest.mark.integration
def test_sync_bn_on_cpu_is_a_one_line_config_error(two_ranks: list[dict[str, Any]]) -> None:
    for r in two_ranks:
        message = r["sync_bn"]
        assert message.startswith("sync_bn='True': SyncBatchNorm cannot run on cpu tensors")
        assert "HINT: pass sync_bn=False on CPU" in message
        assert "\n" not in message


@pytest.mark.integration
def test_manual_seed_is_shared_or_per_rank(two_ranks: list[dict[str, Any]]) -> None:
    first, second = two_ranks
    assert first["shared_draws"] == second["shared_draws"]
    assert (first["own_seed"], second["own_seed"]) == (5, 6)
    assert first["own_draw"] != second["own_draw"]


@pytest.mark.integration
def test_save_on_rank_zero_is_seen_by_every_rank(two_ranks: list[dict[str, Any]]) -> None:
    for r in two_ranks:
        assert (r["loaded_from"], r["loaded_tensor"], r["loaded_device"]) == (0, [0.0, 0.0], "cpu")
        assert r["files"] == ["ckpt.pt"]  # no temporary file left
    first, second = two_ranks
    assert first["failure"].startswith("FileNotFoundError: [Errno 2] no such folder to save into")
    assert second["failure"].startswith("RuntimeError: rank 0 could not save ")
    assert "no such folder to save into" in second["failure"]
