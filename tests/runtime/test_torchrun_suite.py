"""torch's own tests of its launcher (vendored in tests/torchrun_suite, see its README.md), run
with ``unirank run`` and compared with torchrun's results:
``test/distributed/launcher/test_run.py`` (torchrun's), and ``launch_test.py`` with
``test/distributed/test_launcher.py`` (``torch.distributed.launch``'s).
Every test of ``api_test.py`` and ``test_api.py`` (torchrun's Python API) is listed as not
applicable, with the reason, and checked to be listed.

Each file set runs in a pytest subprocess per mode, and the results are compared:

- ``torchrun``: the tests as torch runs them (``torch.distributed.run.main`` is torchrun's).
  Its results depend only on the pinned torch, so they are recorded in
  tests/torchrun_suite/reference.json and run again only with ``UNIRANK_PEER_REFERENCE=1``
  (check the recording) or ``UNIRANK_REGEN_GOLDEN=1`` (rewrite it): see tests/_peer_reference.py;
- ``unirank``: the same tests with ``-p unirank_torchrun_shim``, which points
  ``torch.distributed.run.main`` and ``torch.distributed.launch.main`` at ``python -m unirank
  run``.

Every test that passes with torchrun must pass with unirank, except the ones in
:data:`NOT_APPLICABLE` (they mock torchrun's agent, call its helpers, patch fake GPUs into the
test process, or start no launcher) and in :data:`KNOWN_FAILING` (unirank's gaps, each asserted
to still fail, so that fixing one forces its removal); a test of the launch files that fails
with torchrun too is listed in :data:`FAIL_WITH_TORCHRUN`.

Cost: test_run.py about 85 s with unirank on 2 shared cores (each test starts up to 4
workers), as much again with torchrun when it runs; the launch files about 12 s per mode. Of
test_run.py's 18 applicable tests, 18 pass with torchrun and 18 with unirank; of the launch
files' 3, 2 pass with torchrun and the same 2 with unirank.

Environment variables read: ``UNIRANK_PEER_REFERENCE``, ``UNIRANK_REGEN_GOLDEN`` (above);
``CI`` (through ``unavailable``: without ``expecttest``, which torch's test helpers import,
CI fails and elsewhere the test skips); the subprocesses get this process's environment without
launcher variables, with ``PYTHONPATH`` (unirank's source folder, then tests/torchrun_suite)
and ``CUDA_VISIBLE_DEVICES=""``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

import pytest

import unirank
from _peer_reference import peer_results
from _procs import launcher_free_environ, unavailable

pytestmark = pytest.mark.integration

SUITE = Path(__file__).resolve().parents[1] / "torchrun_suite"
#: the vendored test file, relative to tests/torchrun_suite
TEST_FILE = "test/distributed/launcher/test_run.py"
#: one run of the suite takes about 3 minutes on 2 cores; a hang must not block CI longer
RUN_TIMEOUT_S = 900.0
#: torchrun's results of the vendored files (tests/_peer_reference.py)
REFERENCE = SUITE / "reference.json"

_AGENT = "mocks torchrun's agent (LocalElasticAgent), which unirank run replaces"
#: tests that cannot reach another launcher: test name -> reason
NOT_APPLICABLE: dict[str, str] = {
    "test_launch_elastic_agent_raise_exception": _AGENT + " (LocalElasticAgent.run)",
    "test_launch_shutdown": _AGENT + " and torchrun's rendezvous handler",
    "test_launch_elastic_worker_raise_exception": (
        "asserts torchelastic's event log (a mock of torch.distributed.elastic.events.record "
        "called once in the test process), which torchrun's agent writes"),
    "test_nproc_gpu_launch_configurations": "patches fake GPUs (torch.cuda, torch.accelerator) "
    "into the test process; the launcher in another process sees the real ones",
    "test_nproc_xpu_launch_configurations": "patches fake XPUs into the test process",
    "test_min_max_nodes_parse": "calls torchrun's helper parse_min_max_nnodes; starts no "
    "launcher",
    "test_is_not_torchelastic_launched": "runs the script without any launcher",
    "test_virtual_local_rank": "needs 2 GPUs (torch's own skipIf); skipped in both modes here",
}
#: unirank's gaps: test name -> reason (each must still fail under unirank)
#: (none now: test_launch_elastic_multiple_agents passes since nodes are agents, issue 35, and
#: --rdzv-conf takes torchrun's legacy ``timeout`` key)
KNOWN_FAILING: dict[str, str] = {}

#: the other launcher tests issue 36 names, run in both modes (README.md gives their versions)
LAUNCH_FILES = ("test/distributed/launcher/launch_test.py", "test/distributed/test_launcher.py")
#: vendored files none of whose tests applies: every test of theirs is in OTHER_NOT_APPLICABLE
API_FILES = ("test/distributed/launcher/api_test.py", "test/distributed/launcher/test_api.py")
_API = API_FILES[0] + "::"
_TAPI = API_FILES[1] + "::"
_ELASTIC_LAUNCH = (
    "drives torchrun's agent through its Python API (elastic_launch with a LaunchConfig) in the "
    "test process, which has no command line to hand another launcher; and the class's set-up "
    "starts an etcd server for its etcd rendezvous, which unirank does not provide (and this "
    "host lacks: with torchrun every test of the file errors, FileNotFoundError 'etcd')")
_MOCKED_LAUNCH_AGENT = (_AGENT + " and its rendezvous handler, and calls launch_agent in the "
                        "test process")
#: tests of the other files that cannot reach another launcher: ``file::test`` -> reason
OTHER_NOT_APPLICABLE: dict[str, str] = {
    **{_API + name: _ELASTIC_LAUNCH for name in (
        "test_launch_script_python", "test_launch_script_python_local_rank_transfer",
        "test_launch_script_bash", "test_launch_function", "test_launch_dist_sum_with_static_rdzv",
        "test_launch_elastic", "test_launch_elastic_multiple_agents")},
    _API + "test_launch_elastic_worker_raise_exception": NOT_APPLICABLE[
        "test_launch_elastic_worker_raise_exception"],
    _API + "test_launch_elastic_agent_raise_exception": _AGENT + " (LocalElasticAgent.run)",
    _API + "test_launch_shutdown": _AGENT + " and torchrun's rendezvous handler",
    _API + "test_get_entrypoint_name": "calls torchrun's private helper _get_entrypoint_name; "
    "starts no launcher",
    _API + "test_rdzv_handler_shutdown_on_agent_signal": _MOCKED_LAUNCH_AGENT,
    _API + "test_rdzv_handler_shutdown_on_agent_error": _MOCKED_LAUNCH_AGENT,
    _TAPI + "test_launch_agent_sets_signals_env_var": _MOCKED_LAUNCH_AGENT,
    _TAPI + "test_launch_agent_default_signals": _MOCKED_LAUNCH_AGENT,
}
#: applicable tests that fail with torchrun 2.13 as well: ``file::test`` -> why (each asserted to
#: still fail with torchrun; unirank owes them nothing)
FAIL_WITH_TORCHRUN: dict[str, str] = {
    LAUNCH_FILES[0] + "::test_launch_without_env": (
        "bin/test_script_local_rank.py accepts only --local_rank, and torch.distributed.launch "
        "2.x passes --local-rank=N (torch's CI does not run launch_test.py, its __main__ says so)"),
}


def _test_name(case: ET.Element, qualified: bool) -> str:
    name = case.get("name", "")
    if not qualified:
        return name
    # the class's module, from pytest's root folder: tests/torchrun_suite/test/... in a checkout
    module = case.get("classname", "").rsplit(".", 1)[0].replace(".", "/")
    return f"{module[module.find('test/distributed/'):]}.py::{name}"


def _result(case: ET.Element) -> str:
    for child in case:
        if child.tag in ("failure", "error"):
            return "failed"
        if child.tag == "skipped":
            return "skipped"
    return "passed"


def parse_junit(path: Path, qualified: bool = False) -> dict[str, str]:
    """Test name (``file::name`` if ``qualified``) -> passed / failed / skipped."""
    return {_test_name(c, qualified): _result(c)
            for c in ET.parse(path).getroot().iter("testcase")}


def run_suite(mode: str, folder: Path, files: tuple[str, ...] = (TEST_FILE,)) -> dict[str, str]:
    """Run the vendored ``files`` in ``mode`` (torchrun or unirank); each test's result, by name
    (``file::name`` where several files run)."""
    junit = folder / f"{mode}.xml"
    shim = ("-p", "unirank_torchrun_shim") if mode == "unirank" else ()
    src = str(Path(unirank.__file__).resolve().parents[1])
    env = launcher_free_environ({"PYTHONPATH": os.pathsep.join([src, str(SUITE)]),
                                 "CUDA_VISIBLE_DEVICES": ""}, drop_prefixes=("PET_",))
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *shim,
           f"--junitxml={junit}", *files]
    try:
        proc = subprocess.run(cmd, cwd=SUITE, env=env, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the {mode} run of torch's launcher tests ran past "
                             f"{RUN_TIMEOUT_S:g} s") from exc
    assert junit.exists(), f"{mode}: no results\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return parse_junit(junit, qualified=len(files) > 1)


def torchrun_results(part: str, folder: Path, files: tuple[str, ...]) -> dict[str, str]:
    """torchrun's results of ``files``: recorded for the installed torch, or run again."""
    torch_version = metadata.version("torch").split("+")[0]
    return peer_results(REFERENCE, {"torch": torch_version}, part,
                        lambda: run_suite("torchrun", folder, files))


def test_the_listed_tests_exist() -> None:
    text = (SUITE / TEST_FILE).read_text()
    for name in (*NOT_APPLICABLE, *KNOWN_FAILING):
        assert f"def {name}(" in text, name


def test_every_applicable_test_that_passes_with_torchrun_passes_with_unirank(
        tmp_path: Path) -> None:
    if importlib.util.find_spec("expecttest") is None:
        unavailable("expecttest is not installed (torch's test helpers import it)")
    torchrun = torchrun_results("test_run", tmp_path, (TEST_FILE,))
    ours = run_suite("unirank", tmp_path)
    applicable = sorted(n for n in torchrun if n not in NOT_APPLICABLE)
    passing = [n for n in applicable if torchrun[n] == "passed"]
    print(f"applicable: {len(applicable)}; pass with torchrun: {len(passing)}; with unirank: "
          f"{sum(ours.get(n) == 'passed' for n in passing)}")
    expected = [n for n in passing if n not in KNOWN_FAILING]
    assert [n for n in expected if ours.get(n) != "passed"] == []
    assert [n for n in KNOWN_FAILING if ours.get(n) == "passed"] == [], "fixed: unlist it"


def _test_functions(file: str) -> list[str]:
    return re.findall(r"^    def (test_\w+)\(", (SUITE / file).read_text(), flags=re.M)


def test_every_test_of_the_other_files_is_run_or_listed() -> None:
    """No test of the other vendored files is left out silently: the API files' tests are all
    listed as not applicable, each listed test exists, and the launch files' are all run."""
    for file in API_FILES:
        names = _test_functions(file)
        assert names, file
        assert sorted(f"{file}::{n}" for n in names) == sorted(
            k for k in OTHER_NOT_APPLICABLE if k.startswith(file + "::"))
    for key in FAIL_WITH_TORCHRUN:
        file, name = key.split("::")
        assert file in LAUNCH_FILES and name in _test_functions(file), key


def test_torchs_other_launcher_tests_pass_with_unirank_as_with_torchrun(tmp_path: Path) -> None:
    """launch_test.py and test/distributed/test_launcher.py (torch.distributed.launch's tests):
    every test passes with unirank that passes with torchrun; the rest fail with torchrun too
    and are listed in FAIL_WITH_TORCHRUN."""
    if importlib.util.find_spec("expecttest") is None:
        unavailable("expecttest is not installed (torch's test helpers import it)")
    torchrun = torchrun_results("launch_files", tmp_path, LAUNCH_FILES)
    ours = run_suite("unirank", tmp_path, LAUNCH_FILES)
    assert sorted(n.split("::")[0] for n in torchrun) == sorted(
        f for f in LAUNCH_FILES for _ in _test_functions(f))
    assert {n: r for n, r in torchrun.items() if r != "passed"} == {
        n: "failed" for n in FAIL_WITH_TORCHRUN}
    passing = sorted(n for n, r in torchrun.items() if r == "passed")
    print(f"pass with torchrun: {len(passing)} of {len(torchrun)}; with unirank: "
          f"{sum(ours.get(n) == 'passed' for n in passing)}")
    assert [n for n in passing if ours.get(n) != "passed"] == []
