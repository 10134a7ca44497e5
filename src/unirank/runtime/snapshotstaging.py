"""The half of :func:`unirank.save_state` that runs beside the training loop.

``save_state`` returns once the state is *staged*: its structure copied, every value that is
not a tensor copied, small tensors copied (:func:`unirank.statekeep.rules.copied_now`), the
large ones kept by reference with their version counters (torch bumps a tensor's counter at
every change in place). One thread per process (:class:`Background`) then writes the step to
the node's memory, checks that no tensor kept by reference changed meanwhile, lets the
training loop change them again, and sends the copies to the peer node, all over a process
group of its own (gloo, made once by every rank at the first save: the job's group stays the
program's alone). Until that thread has written the step, any optimizer's ``step()`` waits for
it (a global pre-step hook), and so do the next save, a load and the interpreter's exit. A
step whose tensor did change (an in-place change outside an optimizer's step: a buffer updated
in ``forward``) is not kept, rank 0 says so once, and that tensor is copied before
``save_state`` returns from then on.

Reads: nothing from the environment.
"""

from __future__ import annotations

import atexit
import copy
import threading
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from unirank.signals import keep_off_new_threads, start_shielded
from unirank.statekeep.rules import copied_now

__all__ = ["BACKGROUND", "Background", "Staged", "stage", "state_group"]

#: how long the state's own group waits for a peer in one transfer, and the exit for the thread
STATE_TIMEOUT = timedelta(seconds=300)


class Staged:
    """A state dict as ``save_state`` hands it to the thread: the structure and the values
    copied, the large tensors by reference with their version counters then."""

    def __init__(self, obj: dict[str, Any], versions: dict[str, tuple[torch.Tensor, int]]) -> None:
        self.obj = obj
        self.versions = versions
        #: the paths :meth:`changed` found once the step was written (by the thread)
        self.torn: list[str] = []
        #: the files this rank wrote into the node's memory, with their CRC-32s (by the thread)
        self.written: dict[str, str] = {}

    def changed(self) -> list[str]:
        """The paths of the tensors kept by reference that changed since they were staged."""
        return sorted(path for path, (tensor, version) in self.versions.items()
                      if tensor._version != version)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor whose bytes are saved (a DTensor's local shard; its version counter is the
    shard's: ``to_local().add_()`` moves it, not the DTensor's)."""
    local = getattr(tensor, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else tensor


def stage(obj: Mapping[str, Any], torn_before: frozenset[str]) -> Staged:
    """Stage ``obj`` (see the module); a ``Stateful`` value (DCP's protocol) gives its
    ``state_dict()`` now."""
    from torch.distributed.checkpoint.stateful import Stateful

    versions: dict[str, tuple[torch.Tensor, int]] = {}

    def walk(value: Any, path: str) -> Any:
        if isinstance(value, Stateful):
            value = value.state_dict()
        if isinstance(value, torch.Tensor):
            local = _local(value)
            if copied_now(local.numel() * local.element_size(), path, torn_before):
                return value.detach().clone()
            versions[path] = (local, local._version)
            return value
        if isinstance(value, Mapping):
            return {key: walk(item, f"{path}/{key}") for key, item in value.items()}
        if isinstance(value, list | tuple):
            items = [walk(item, f"{path}/{index}") for index, item in enumerate(value)]
            return items if isinstance(value, list) else tuple(items)
        return copy.deepcopy(value)

    staged = {key: walk(value, str(key)) for key, value in obj.items()}
    return Staged(staged, versions)


class Background:
    """The one thread that finishes a save; ``written`` once the step is in memory (or the
    thread ended)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._written = threading.Event()
        self._written.set()
        self._hooked = False
        self._owed: Callable[[], None] | None = None
        self.error: BaseException | None = None

    def owe(self, settle: Callable[[], None] | None) -> None:
        """Keep ``settle`` to run at the next :meth:`settle` (None: nothing owed): rank 0's
        part of a ``dcp.save`` that wrote but may never reach its ``finish``, where the other
        ranks' threads wait for it (:mod:`.snapshotdcp`)."""
        self._hook()
        self._owed = settle

    def settle(self) -> None:
        """Run what is owed, once (the next save, a load, the interpreter's exit)."""
        owed, self._owed = self._owed, None
        if owed is not None:
            owed()

    def start(self, write: Callable[[], None], after: Callable[[], None]) -> None:
        """Run ``write`` (the step into memory, then the check), then ``after`` (the copies to
        the peer), in the thread; the previous save first ends."""
        self.join()
        self._hook()
        self._written.clear()
        self.error = None

        def run() -> None:
            try:
                write()
            except BaseException as exc:  # the next save or load says it
                self.error = exc
                return
            finally:
                self._written.set()
            try:
                after()
            except BaseException as exc:
                self.error = exc

        self._thread = threading.Thread(target=run, name="unirank-state-save", daemon=True)
        start_shielded(self._thread)

    def wait_written(self) -> None:
        """Until the running save has written its step (the tensors may change again)."""
        self._written.wait(STATE_TIMEOUT.total_seconds())

    def join(self) -> None:
        """Until the running save ended (bounded by :data:`STATE_TIMEOUT`)."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(STATE_TIMEOUT.total_seconds())
        self._thread = None

    def _hook(self) -> None:
        if self._hooked:
            return
        self._hooked = True
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        register_optimizer_step_pre_hook(lambda _optimizer, _args, _kwargs: self.wait_written())
        atexit.register(self._at_exit)

    def _at_exit(self) -> None:
        self.settle()
        self.join()


BACKGROUND = Background()

_GROUP: dict[str, Any] = {}


def state_group() -> Any:
    """The state's own process group, made at the first call after the job's group started
    (by every rank, as every ``save_state`` is): gloo, over every rank."""
    world = dist.group.WORLD
    if _GROUP.get("world") is not world:  # first, or the program started its group again
        with keep_off_new_threads():  # its threads take no signal of the program's
            _GROUP["group"] = dist.new_group(backend="gloo", timeout=STATE_TIMEOUT)
        _GROUP["world"] = world
    return _GROUP["group"]
