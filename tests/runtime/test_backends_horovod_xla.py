"""The pure parts of the horovod and xla-tpu backends: Horovod's slot plan, the variables
horovodrun would give a worker, the network interface, the registry's choices (``auto`` under
horovodrun), and the refusal of several XLA:CPU processes.

Running Horovod itself is tested in tests/integration/test_horovod.py. The one mock here stands
for a Python without Horovod (``importlib.util.find_spec`` answers None), since this one has it.
A Python without Horovod skips the tests that need it with a one-line reason; with ``CI=true``
they fail (DEVELOPERS.md: CI installs every lane).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator, Mapping

import pytest

from _procs import unavailable
from unirank import netroute
from unirank.errors import ConfigError
from unirank.runtime import backends
from unirank.runtime.backends import Backend, CudaFacts, choose_backend
from unirank.runtime.backends import horovod as hvd_backend
from unirank.runtime.backends.horovod import Slot, slot_environment, slot_plan

NO_CUDA = CudaFacts(available=False, device_count=0, nccl_available=False)


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        # block placement, 2 per node: what horovodrun -H a:2,b:2 gives
        (["a", "a", "b", "b"],
         [("a", 0, 2, 0, 2), ("a", 1, 2, 0, 2), ("b", 0, 2, 1, 2), ("b", 1, 2, 1, 2)]),
        # cyclic placement (srun -m cyclic): local ranks follow rank order within a node
        (["a", "b", "a", "b"],
         [("a", 0, 2, 0, 2), ("b", 0, 2, 1, 2), ("a", 1, 2, 0, 2), ("b", 1, 2, 1, 2)]),
        # uneven: a's second rank has no partner on b, so its cross world is itself
        (["a", "a", "b"], [("a", 0, 2, 0, 2), ("a", 1, 2, 0, 1), ("b", 0, 1, 1, 2)]),
        (["solo"], [("solo", 0, 1, 0, 1)]),
    ],
)
def test_slot_plan(hosts: list[str], expected: list[tuple[str, int, int, int, int]]) -> None:
    plan = slot_plan(hosts)
    assert [s.rank for s in plan] == list(range(len(hosts)))
    assert {s.size for s in plan} == {len(hosts)}
    assert [(s.hostname, s.local_rank, s.local_size, s.cross_rank, s.cross_size)
            for s in plan] == expected


def test_slot_environment_is_horovodrun_s() -> None:
    slot = Slot("node2", rank=3, local_rank=1, local_size=2, cross_rank=1, cross_size=2, size=4)
    assert slot_environment(slot, "node1", 4321, "eth0") == {
        "HOROVOD_HOSTNAME": "node2", "HOROVOD_RANK": "3", "HOROVOD_SIZE": "4",
        "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "1",
        "HOROVOD_CROSS_SIZE": "2", "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "node1",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": "4321", "HOROVOD_GLOO_IFACE": "eth0",
    }
    assert "HOROVOD_GLOO_IFACE" not in slot_environment(slot, "node1", 4321, None)


def test_slot_text_round_trips_host_names_with_commas() -> None:
    slot = Slot("odd,name", 2, 0, 1, 2, 3, 3)
    assert hvd_backend._decode(hvd_backend._encode(slot, 99)) == (slot, 99)


def test_interface_names_given_by_the_user_win() -> None:
    assert hvd_backend.interface_towards("10.1.1.1", {"HOROVOD_GLOO_IFACE": "ib0"}) == "ib0"
    assert hvd_backend.interface_towards("10.1.1.1", {"GLOO_SOCKET_IFNAME": "eth1,eth2"}) == "eth1"


def test_interface_towards_the_loopback_is_lo() -> None:
    assert hvd_backend.interface_towards("127.0.0.1", {}) == "lo"
    if "::1" in netroute.interfaces().get("lo", ()):
        assert hvd_backend.interface_towards("::1", {}) == "lo"


def test_uses_unirank_store_unless_horovodrun_brought_a_rendezvous() -> None:
    entry = backends.get("horovod")
    assert entry.uses_store({}) is True
    assert entry.uses_store({"HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1"}) is False


def require_horovod(environ: Mapping[str, str] = os.environ) -> None:
    """Skip (fail with ``CI=true`` in ``environ``) with a one-line reason when this Python has
    no Horovod. Reads ``CI``."""
    problem = hvd_backend.problem(NO_CUDA)
    if problem is not None:
        unavailable("Horovod is not installed in this Python: run scripts/setup --horovod",
                    problem, environ)


@pytest.fixture
def installed() -> Iterator[None]:
    require_horovod()
    yield


def test_auto_picks_horovod_under_horovodrun_only(installed: None) -> None:
    assert choose_backend("auto", NO_CUDA, launcher="horovodrun") == "horovod"
    assert choose_backend(None, NO_CUDA, launcher="horovodrun") == "horovod"
    assert choose_backend("auto", NO_CUDA, launcher="slurm") == "gloo"
    assert choose_backend("gloo", NO_CUDA, launcher="horovodrun") == "gloo"


def test_a_launcher_entry_wins_auto_over_priority() -> None:
    entry = backends.register(Backend(name="mine", init=lambda **kw: None, finalize=lambda: None,
                                      launchers=("weird",)))
    try:
        assert choose_backend("auto", NO_CUDA, launcher="weird") == "mine"
        assert choose_backend("auto", NO_CUDA, launcher="other") == "gloo"
    finally:
        backends.unregister(entry.name)


def test_horovod_missing_is_one_config_error_with_the_setup_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mock: this Python has Horovod, so find_spec is made to answer as one without it would."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "horovod" else real(name, *a))
    with pytest.raises(ConfigError) as caught:
        choose_backend("horovod", NO_CUDA)
    message = str(caught.value)
    assert "the horovod backend needs Horovod, which is not installed" in message
    assert "scripts/setup --horovod" in message
    # auto under horovodrun falls back to the usual choice instead of failing
    assert choose_backend("auto", NO_CUDA, launcher="horovodrun") == "gloo"


def test_a_python_without_horovod_fails_its_tests_in_ci_and_skips_them_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mock: this Python has Horovod, so find_spec is made to answer as one without it would."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "horovod" else real(name, *a))
    with pytest.raises(pytest.fail.Exception, match="scripts/setup --horovod"):
        require_horovod({"CI": "true"})
    with pytest.raises(pytest.skip.Exception, match="scripts/setup --horovod"):
        require_horovod({})


def test_xla_is_never_auto_and_has_its_aliases() -> None:
    entry = backends.get("XLA")
    assert entry.name == "xla-tpu" and backends.get("xla-tpu") is entry
    assert entry.auto_priority is None and entry.spawn is not None


@pytest.mark.parametrize(("world", "device", "refused"),
                         [(2, "CPU", True), (8, "cpu", True), (1, "CPU", False), (8, "TPU", False)])
def test_xla_refuses_several_cpu_processes_at_once(world: int, device: str, refused: bool) -> None:
    """Pure: the refusal needs no torch_xla when PJRT_DEVICE says the device type."""
    from unirank.runtime.backends.xla import check_world

    if not refused:
        check_world(world, {"PJRT_DEVICE": device})
        return
    with pytest.raises(ConfigError) as caught:
        check_world(world, {"PJRT_DEVICE": device})
    assert caught.value.variable == "PJRT_DEVICE"
    assert f"asks for {world} XLA processes on the CPU" in str(caught.value)
    assert "pytorch/xla/issues/9089" in str(caught.value) and "TPU" in str(caught.value)
