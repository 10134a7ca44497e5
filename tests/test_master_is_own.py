"""The process that serves the rendezvous store refuses a master address that is not its host's,
at once and in one line, instead of leaving every rank waiting for the init timeout; and a
one-node run does not use an inherited MASTER_ADDR at all (as torchrun).

The unit tests give :func:`unirank.netroute.is_own` and :func:`unirank.resolve.require_own`
interface tables as dicts. The process tests run the real thing with a 300 s init timeout and a
60 s subprocess timeout (a wait for the init timeout fails the test): ``unirank run`` with and
without the fork server, ``Parallel``, and a hand-set torchrun-style rank 0 in ``ur.init``. The
foreign address is a TEST-NET one that no interface here holds; nothing is sent to it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from _procs import Runner, free_port, launcher_free_environ, wait_gone
from unirank import netroute
from unirank.errors import ConfigError
from unirank.resolve import require_own

REPO = Path(__file__).resolve().parents[1]
#: TEST-NET-2 (RFC 5737): on no interface of this host
FOREIGN = "198.51.100.7"
IFACES = {"lo": ("127.0.0.1", "::1"), "eth0": ("10.1.2.3", "fe80::1")}
_NOISE = ("Traceback", "frame #", "Exception raised from", "[c10d]")


@pytest.fixture(autouse=True)
def _foreign_is_foreign() -> None:
    if netroute.is_own(FOREIGN, netroute.interfaces()):
        pytest.skip(f"{FOREIGN} is an address of this host")


@pytest.mark.parametrize("address", ["127.0.0.1", "127.5.6.7", "::1", "[::1]", "0.0.0.0", "::",
                                     "10.1.2.3", "fe80::1%eth0", "::ffff:10.1.2.3"])
def test_own_addresses(address: str) -> None:
    assert netroute.is_own(address, IFACES)


@pytest.mark.parametrize("address", [FOREIGN, "10.1.2.4", "fe80::2", "node0", ""])
def test_foreign_addresses(address: str) -> None:
    assert not netroute.is_own(address, IFACES)


def _refusal(host: str, environ: dict[str, str], ifaces: dict[str, tuple[str, ...]]) -> str:
    """``require_own``'s one-line refusal of ``host`` as MASTER_ADDR, or "" when it takes it."""
    try:
        require_own(host, source="MASTER_ADDR", environ=environ, ifaces=ifaces)
    except ConfigError as refused:
        return str(refused)
    return ""


def test_a_name_counts_when_it_resolves_to_an_own_address() -> None:
    assert _refusal("localhost", {}, {}) == ""  # loopback: always own
    assert _refusal("localhost", {}, IFACES) == ""


def test_a_foreign_master_is_one_line_naming_address_source_and_hint() -> None:
    with pytest.raises(ConfigError) as info:
        require_own(FOREIGN, source="--master-addr", environ={}, ifaces=IFACES)
    message = str(info.value)
    assert message.startswith(f"--master-addr='{FOREIGN}': is not an address of this host")
    assert message.endswith("HINT: give --master-addr this node's host name or one of its "
                            "addresses (127.0.0.1 will do on one node; here: 10.1.2.3), or set "
                            "UNIRANK_MASTER_FORWARDED=1 if it is forwarded to this host")
    assert "\n" not in message


def test_a_master_forwarded_to_this_host_is_taken_as_given() -> None:
    """A NAT or virtual address is none of the interfaces': UNIRANK_MASTER_FORWARDED=1 says so."""
    assert _refusal(FOREIGN, {}, IFACES).startswith(f"MASTER_ADDR='{FOREIGN}': ")
    assert _refusal(FOREIGN, {"UNIRANK_MASTER_FORWARDED": "1"}, IFACES) == ""


def _marked(extra: dict[str, str]) -> tuple[dict[str, str], str]:
    mark = f"UNIRANK_TEST_MARK_{uuid.uuid4().hex}"
    return launcher_free_environ({"UNIRANK_INIT_TIMEOUT": "300", mark: "1", **extra}), mark


def _left_behind(mark: str) -> list[int]:
    """Processes that still carry ``mark`` in their environment, after waiting for them."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as handle:
                    if mark.encode() + b"=1\0" in handle.read():
                        found.append(int(name))
            except OSError:
                continue
    return wait_gone(found, timeout=30)


def _run(command: list[str], extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env, mark = _marked(extra)
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=60, check=False, stdin=subprocess.DEVNULL)
    assert _left_behind(mark) == [], result.stderr
    return result


def _assert_refused(result: subprocess.CompletedProcess[str], prefix: str, source: str) -> None:
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{prefix}{source}='{FOREIGN}': is not an address of this host"), \
        result.stderr
    assert not any(noise in result.stderr for noise in _NOISE), result.stderr
    assert result.stdout == ""


RUNS = [
    (["--master-addr", FOREIGN], {}, "--master-addr"),
    (["--rdzv-endpoint", f"{FOREIGN}:29400"], {}, "--rdzv-endpoint"),
    # node 0 of two: an inherited MASTER_ADDR is used there, and node 0 knows it is not its own
    (["--nnodes", "2", "--node-rank", "0"], {"MASTER_ADDR": FOREIGN}, "MASTER_ADDR"),
]


@pytest.mark.parametrize("preload", [[], ["--no-preload"]], ids=["fork-server", "no-preload"])
@pytest.mark.parametrize(("options", "extra", "source"), RUNS, ids=["option", "endpoint", "env"])
def test_unirank_run_refuses_a_foreign_master_before_any_worker(
        preload: list[str], options: list[str], extra: dict[str, str], source: str) -> None:
    result = _run(Runner.command([*preload, "-n", "2", *options, "examples/helloworld.py"]),
                  extra)
    assert result.returncode == 2, result.stderr
    _assert_refused(result, "unirank run: error: ", source)


@pytest.mark.parametrize("preload", [[], ["--no-preload"]], ids=["fork-server", "no-preload"])
def test_one_node_ignores_a_stale_master_addr(preload: list[str]) -> None:
    """``MASTER_ADDR=<stale> unirank run -n 2``: the ranks meet on localhost, as torchrun's
    (2.13, checked by hand: its one-node rendezvous is at localhost:0, whatever is exported)."""
    result = _run(Runner.command([*preload, "-n", "2", "-m", "unirank", "info", "--json"]),
                  {"MASTER_ADDR": FOREIGN})
    assert result.returncode == 0, result.stderr
    assert result.stdout.count('"master_addr": "localhost"') == 2, result.stdout
    assert FOREIGN not in result.stdout + result.stderr


_PARALLEL = """
import logging, sys
import unirank as ur
# Parallel logs ignite's INFO lines ("Spawn function ..."), as ignite does: only the refusal here
logging.getLogger("ignite.distributed.launcher.Parallel").setLevel(logging.WARNING)
from unirank.errors import ConfigError

def hello(local_rank):
    print("ran", local_rank, flush=True)

if __name__ == "__main__":
    try:
        ur.Parallel(backend="gloo", nproc_per_node=2, **eval(sys.argv[1])).run(hello)
    except ConfigError as exc:
        print(f"parallel: error: {exc}", file=sys.stderr)
        sys.exit(2)
"""


@pytest.mark.parametrize("preload", ["0", "1"], ids=["fork-server", "no-preload"])
def test_parallel_refuses_a_foreign_master_addr(tmp_path: Path, preload: str) -> None:
    script = tmp_path / "parallel.py"
    script.write_text(_PARALLEL)
    extra = {"UNIRANK_NO_PRELOAD": preload}
    result = _run([sys.executable, str(script), f"dict(master_addr={FOREIGN!r})"], extra)
    assert result.returncode == 2, result.stderr
    _assert_refused(result, "parallel: error: ", "master_addr")
    # and a stale MASTER_ADDR on one node is not used at all
    result = _run([sys.executable, str(script), "{}"], {**extra, "MASTER_ADDR": FOREIGN})
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split("\n")) == ["", "ran 0", "ran 1"]


def test_a_torchrun_style_rank_0_refuses_in_init() -> None:
    result = _run([sys.executable, "examples/helloworld.py"], {
        "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": FOREIGN, "MASTER_PORT": str(free_port())})
    assert result.returncode != 0
    _assert_refused(result, "helloworld.py: error: ", "MASTER_ADDR")


def test_the_forwarded_flag_reads_as_every_on_off_variable() -> None:
    """UNIRANK_MASTER_FORWARDED is read by :func:`unirank.contract.flag`, as
    UNIRANK_NO_PRELOAD and UNIRANK_NO_SRUN are: anything but "" or "0" turns it on."""
    for on in ("1", "yes", "true", " 1 "):
        assert _refusal(FOREIGN, {"UNIRANK_MASTER_FORWARDED": on}, IFACES) == "", on
    for off in ("", "0", " 0 "):
        assert _refusal(FOREIGN, {"UNIRANK_MASTER_FORWARDED": off}, IFACES) != "", off
