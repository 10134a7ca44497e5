"""pytorch-ignite 0.5.5's own tests of ``ignite.distributed``, run with ignite and with unirank.

The four test files vendored in tests/ignite_suite (see its README.md) run in a pytest
subprocess per run and per mode, and their results are compared:

- runs: ``one_process`` (all their tests in one process, no ``WORLD_SIZE``: the spawn, torchrun
  and ``Parallel`` tests run here) and ``two_ranks`` (``WORLD_SIZE=2``, the ``distributed``
  tests on two pytest-xdist ranks with ``--dist=each``, as ignite's run_cpu_tests.sh does);
- modes: ``ignite`` (ignite's own ``ignite.distributed``) and ``unirank`` (the same tests with
  ``-p unirank_shim``, which points ``ignite.distributed`` at unirank). ignite's results depend
  only on the pinned ignite and torch, so they are recorded in tests/ignite_suite/reference.json
  and run again only with ``UNIRANK_PEER_REFERENCE=1`` (check the recording) or
  ``UNIRANK_REGEN_GOLDEN=1`` (rewrite it): see tests/_peer_reference.py.

Every test that passes with ignite must pass with unirank, except the ones in
:data:`NOT_APPLICABLE` (they reach ignite's private internals), in :data:`KNOWN_FAILING`
(unirank's gaps, each asserted to still fail, so that fixing one forces its removal) and in
:data:`DIFFERS` (a meaning unirank changes on purpose: each must fail with the one failure
that says so).

Cost: about 120 s on 2 cores with the recording (one process: 75 s with unirank; two ranks:
40 s), 225 s more where ignite runs too (183 s and 42 s), most of it the spawn, torchrun and
horovod tests that start 4 processes.

Environment variables read: ``UNIRANK_PEER_REFERENCE``, ``UNIRANK_REGEN_GOLDEN`` (above);
``CI`` (through ``unavailable``: without pytest-xdist or with another ignite than the vendored
tag, CI fails and elsewhere the tests skip); the subprocesses get this
process's environment without launcher variables, with ``PYTHONPATH`` (unirank's source folder,
then tests/ignite_suite), ``CUDA_VISIBLE_DEVICES=""`` and, for ``two_ranks``, ``WORLD_SIZE=2``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import importlib.util
import os
import signal
import subprocess
import sys
import sysconfig
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from importlib import metadata
from pathlib import Path

import pytest

import unirank
from _peer_reference import peer_results
from _procs import launcher_free_environ
from conftest import unavailable

pytestmark = pytest.mark.integration

SUITE = Path(__file__).resolve().parents[1] / "ignite_suite"
#: the ignite release whose tests are vendored (tests/ignite_suite/README.md)
IGNITE_VERSION = "0.5.5"
#: the vendored test files, relative to tests/ignite_suite/tests/ignite/distributed
FILES = ("utils/test_serial.py", "utils/test_native.py", "test_auto.py", "test_launcher.py")
#: held while a run goes on (see _suite_lock)
SUITE_LOCK = "/tmp/unirank-ignite-suite.lock"
#: one run of the suite takes about 3 minutes on 2 cores; a hang must not block CI longer
RUN_TIMEOUT_S = 900.0
#: ignite's results of each run (tests/_peer_reference.py)
REFERENCE = SUITE / "reference.json"

#: tests that reach ignite's private internals (``_model``'s own attributes, ignite's private
#: classes): they cannot pass against another implementation; test id -> reason
_MODEL_TYPE = "asserts the class of ignite's private _model"
_MAX_LENGTH = "calls ignite's private _model._get_max_length"
_INIT_METHOD = "asserts ignite's private _model._init_method (after the public checks)"
_SCRIPT = ("runs check_idist_parallel.py, which asserts ignite's private _model._init_method "
           "(after the public checks, before the log lines are compared)")
NOT_APPLICABLE: dict[str, str] = {
    "utils/test_serial.py::test_no_distrib": _MODEL_TYPE,
    "utils/test_serial.py::test_sync_no_dist": _MODEL_TYPE,
    "utils/test_serial.py::test_idist__model_methods_no_dist": _MAX_LENGTH,
    "utils/test_native.py::test_sync_as_native_gloo": _MODEL_TYPE,
    "utils/test_native.py::test_idist__model_methods_gloo": _MAX_LENGTH,
    "utils/test_native.py::test_native_distrib_single_node_launch_tool_gloo[FILE]": _INIT_METHOD,
    "test_launcher.py::test_idist_parallel_spawn_n_procs_native[gloo-env://]": _INIT_METHOD,
    "test_launcher.py::test_idist_parallel_spawn_n_procs_native[gloo-FILE]": _INIT_METHOD,
    "test_launcher.py::test_idist_parallel_n_procs_native[gloo-env://]": _INIT_METHOD,
    "test_launcher.py::test_idist_parallel_n_procs_native[gloo-FILE]": _INIT_METHOD,
    "test_launcher.py::test_check_idist_parallel_torch_launch_n_procs_native[gloo-None]": _SCRIPT,
    "test_launcher.py::test_check_idist_parallel_torch_launch_n_procs_native[gloo-FILE]": _SCRIPT,
    "test_launcher.py::test_check_idist_parallel_spawn_n_procs_native[gloo]": _SCRIPT,
    "test_launcher.py::test_smoke_test_check_idist_parallel_spawn_multinode_n_procs_gloo": _SCRIPT,
}

#: tests that pass with ignite and still fail with unirank, by run; test id -> why (the
#: behaviour to fix). Each one is asserted to still fail with unirank.
KNOWN_FAILING: dict[str, dict[str, str]] = {"one_process": {}, "two_ranks": {}}

#: tests that assert a meaning unirank changes on purpose (docs/ignite.md, "Where the meaning
#: differs"), by run; test id -> (why, the text of the failure they must end with: the
#: assertions before it still run and pass)
DIFFERS: dict[str, dict[str, tuple[str, str]]] = {
    "one_process": {},
    "two_ranks": {
        "utils/test_native.py::test_idist_broadcast_gloo": (
            "asserts, after its broadcasts, that broadcast([0, 1, 2]) is a TypeError: "
            "unirank's broadcast takes any picklable object, as all_gather does",
            "DID NOT RAISE <class 'TypeError'>"),
    },
}


@dataclasses.dataclass(frozen=True)
class Run:
    """How one run of the suite is started."""

    args: tuple[str, ...]
    env: Mapping[str, str]


RUNS: dict[str, Run] = {
    "one_process": Run(args=(), env={}),
    "two_ranks": Run(
        args=("-m", "distributed", "--dist=each", f"--tx=2*popen//python={sys.executable}"),
        env={"WORLD_SIZE": "2"},
    ),
}


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The results of one run in one mode: test id -> ``passed``/``failed``/``skipped``."""

    results: dict[str, str]
    seconds: float
    log: str
    #: test id -> the failure messages of its reports (run here only: not recorded)
    failures: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    def passed(self) -> set[str]:
        """The ids of the tests that passed."""
        return {t for t, r in self.results.items() if r == "passed"}


def _test_id(case: ET.Element) -> str:
    """``utils/test_native.py::test_x[param]`` from a junit ``testcase``."""
    module = case.get("classname", "").removeprefix("tests.ignite.distributed.")
    return f"{module.replace('.', '/')}.py::{case.get('name')}"


def _result(case: ET.Element) -> str:
    """One junit ``testcase``'s result."""
    if case.find("failure") is not None or case.find("error") is not None:
        return "failed"
    return "skipped" if case.find("skipped") is not None else "passed"


def parse_junit(path: Path) -> dict[str, str]:
    """Test id -> result from a junit file; a test reported several times (once per xdist rank,
    or again for a teardown error) passes only if every report passed."""
    results: dict[str, list[str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        results.setdefault(_test_id(case), []).append(_result(case))
    merged = {}
    for test, seen in results.items():
        merged[test] = next((r for r in ("failed", "passed") if r in seen), "skipped")
    return merged


def failure_messages(path: Path) -> dict[str, list[str]]:
    """Test id -> the messages of its failed reports, from a junit file."""
    messages: dict[str, list[str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        for failure in (case.find("failure"), case.find("error")):
            if failure is not None:
                messages.setdefault(_test_id(case), []).append(failure.get("message", ""))
    return messages


def _unirank_src() -> str:
    """The folder this process imports unirank from."""
    return str(Path(unirank.__file__).resolve().parents[1])


def user_site(userbase: Path, mode: str) -> Path:
    """Make ``userbase`` the ``PYTHONUSERBASE`` of a run: in unirank mode its site folder holds a
    ``.pth`` line that, in every Python process of the run (ignite's tests replace
    ``PYTHONPATH`` for the scripts they start, so it cannot carry this), puts unirank's source
    first on ``sys.path`` and registers :mod:`unirank_shim`. In ignite mode it is empty (both
    modes hide the machine's own user site the same way)."""
    scheme = f"{os.name}_user"
    site_dir = Path(sysconfig.get_path("purelib", scheme, vars={"userbase": str(userbase)}))
    site_dir.mkdir(parents=True, exist_ok=True)
    if mode == "unirank":
        line = (f"import sys; sys.path[:0] = [{_unirank_src()!r}]; "
                f"sys.path.append({str(SUITE)!r}); import unirank_shim; unirank_shim.register()\n")
        (site_dir / "unirank_ignite_shim.pth").write_text(line)
    return userbase


def suite_environ(run: Run, userbase: Path) -> dict[str, str]:
    """The environment of the pytest subprocess of ``run``."""
    path = os.pathsep.join(p for p in (_unirank_src(), str(SUITE), os.environ.get("PYTHONPATH", ""))
                           if p)
    return launcher_free_environ({"PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": "",
                                  "PYTHONUSERBASE": str(userbase), **run.env})


@contextlib.contextmanager
def _suite_lock() -> Iterator[None]:
    """Hold :data:`SUITE_LOCK` (waiting for a run of another process to end): ignite's fixtures
    share fixed paths under /tmp (``/tmp/free_port``), so two runs at once disturb each other."""
    with open(SUITE_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def run_suite(run: Run, mode: str, folder: Path) -> Outcome:
    """Run the vendored files under ``run`` with ignite's or unirank's ``ignite.distributed``
    (results and the user site folder in ``folder``)."""
    shim = ("-p", "unirank_shim") if mode == "unirank" else ()
    files = [f"tests/ignite/distributed/{f}" for f in FILES]
    # a test that fails at ignite's private check may leave its group started, which would
    # spoil the tests after it: unirank runs leave the not-applicable ones out
    skipped = [arg for test in NOT_APPLICABLE if mode == "unirank"
               for arg in ("--deselect", f"tests/ignite/distributed/{test}")]
    junit = folder / f"{mode}.xml"
    cmd = [sys.executable, "-m", "pytest", "-c", "pytest.ini", "-q", "-rA", *shim, *run.args,
           *skipped, f"--junitxml={junit}", *files]
    env = suite_environ(run, user_site(folder / f"{mode}_userbase", mode))
    with _suite_lock():
        start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=SUITE, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                start_new_session=True)
        try:
            log, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            log, _ = proc.communicate()
            pytest.fail(f"{mode} run did not end in {RUN_TIMEOUT_S} s:\n{log[-4000:]}")
    if proc.returncode not in (0, 1) or not junit.exists():
        pytest.fail(f"{mode} run ended with status {proc.returncode}:\n{log[-4000:]}")
    return Outcome(parse_junit(junit), time.monotonic() - start, log, failure_messages(junit))


def _require_ignite() -> None:
    """The ignite release of the vendored tests."""
    have = metadata.version("pytorch-ignite") if importlib.util.find_spec("ignite") else "none"
    if have != IGNITE_VERSION:
        unavailable(f"the vendored tests are ignite {IGNITE_VERSION}'s; installed: {have}")


def _require_tools() -> None:
    """The ignite release of the vendored tests, and pytest-xdist for the two-rank run."""
    _require_ignite()
    if importlib.util.find_spec("xdist") is None:
        unavailable("pytest-xdist is not installed (pip install -e '.[test]')")


@pytest.fixture(scope="module", params=sorted(RUNS))
def outcomes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[str, Outcome, Outcome]]:
    """(run name, ignite's outcome, unirank's outcome) of one run."""
    _require_tools()
    name: str = request.param
    folder = tmp_path_factory.mktemp(f"ignite_suite_{name}")
    versions = {"pytorch-ignite": IGNITE_VERSION, "torch": metadata.version("torch").split("+")[0]}
    recorded = f"(recorded in {REFERENCE.relative_to(SUITE.parent.parent)})"
    ignite = Outcome(peer_results(REFERENCE, versions, name,
                                  lambda: run_suite(RUNS[name], "ignite", folder).results),
                     0.0, recorded)
    unirank_ = run_suite(RUNS[name], "unirank", folder)
    print(f"{name}: ignite passes {len(ignite.passed())}, unirank "
          f"{len(unirank_.passed() & ignite.passed())} of them in {unirank_.seconds:.0f} s")
    yield name, ignite, unirank_


def test_ignite_passes_its_own_suite(outcomes: tuple[str, Outcome, Outcome]) -> None:
    """The harness runs ignite's tests as ignite does: with ignite, nothing fails, and each
    vendored file has a passing test in the one-process run."""
    name, ignite, _ = outcomes
    failed = sorted(t for t, r in ignite.results.items() if r == "failed")
    assert not failed, f"{name}: ignite's tests fail with ignite: {failed}\n{ignite.log[-4000:]}"
    if name == "one_process":
        assert {t.split("::")[0] for t in ignite.passed()} == set(FILES)
    assert ignite.passed(), ignite.log[-4000:]


def test_what_passes_with_ignite_passes_with_unirank(outcomes: tuple[str, Outcome, Outcome]
                                                     ) -> None:
    """Every test passing with ignite passes with unirank, but the listed exceptions."""
    name, ignite, uni = outcomes
    excused = NOT_APPLICABLE.keys() | KNOWN_FAILING[name].keys() | DIFFERS[name].keys()
    broken = sorted(t for t in ignite.passed() - uni.passed() if t not in excused)
    assert not broken, f"{name}: pass with ignite, not with unirank: {broken}\n{uni.log[-6000:]}"


def test_known_failing_still_fail(outcomes: tuple[str, Outcome, Outcome]) -> None:
    """Each KNOWN_FAILING entry passes with ignite and still fails with unirank: one that passes
    now, or no longer exists, must leave the table."""
    name, ignite, uni = outcomes
    stale = sorted(t for t in KNOWN_FAILING[name] if t not in ignite.passed() or t in uni.passed())
    assert not stale, f"{name}: remove from KNOWN_FAILING (passes with unirank, or gone): {stale}"


def test_the_meaning_differs_where_said(outcomes: tuple[str, Outcome, Outcome]) -> None:
    """Each DIFFERS entry passes with ignite and fails with unirank at the one check whose
    meaning differs (its failure text is in unirank's report), not earlier."""
    name, ignite, uni = outcomes
    for test, (_, failure) in DIFFERS[name].items():
        assert test in ignite.passed() and uni.results.get(test) == "failed", test
        said = uni.failures.get(test, [])
        assert said and all(failure in message for message in said), (
            f"{name}: {test} must fail with {failure!r}, not {said}\n{uni.log[-6000:]}")


def test_not_applicable_are_real_tests(outcomes: tuple[str, Outcome, Outcome]) -> None:
    """Each NOT_APPLICABLE entry is a test of the vendored files (no stale entry)."""
    _, ignite, _ = outcomes
    unknown = sorted(t for t in NOT_APPLICABLE if t not in ignite.results)
    if outcomes[0] == "one_process":
        assert not unknown, f"NOT_APPLICABLE names tests that do not exist: {unknown}"


def test_shim_points_public_names_at_unirank(tmp_path: Path) -> None:
    """With the shim, ignite.distributed's public names (top level and submodules) are unirank's,
    its private names ignite's, and ignite's other packages keep ignite's module."""
    code = (
        "import unirank, ignite.metrics.metric as met\n"
        "import ignite.distributed as idist\n"
        "from ignite.distributed.utils import all_gather, _assert_backend, _model\n"
        "from ignite.distributed.auto import auto_dataloader\n"
        "from ignite.distributed.launcher import Parallel\n"
        "from ignite.distributed.comp_models import _SerialModel\n"
        "assert idist.get_rank is unirank.get_rank and all_gather is unirank.all_gather\n"
        "assert auto_dataloader is unirank.auto_dataloader and Parallel is unirank.Parallel\n"
        "assert _assert_backend.__module__ == 'ignite.distributed.utils'\n"
        "assert _model.get_world_size() == unirank.get_world_size()\n"
        "assert met.idist.get_rank is not unirank.get_rank\n"
        "try:\n    idist.registered_computation_models\nexcept AttributeError:\n    pass\n"
        "else:\n    raise AssertionError('a public name unirank lacks came from ignite')\n"
    )
    _require_ignite()
    env = suite_environ(RUNS["one_process"], user_site(tmp_path, "unirank"))
    env["PYTHONPATH"] = ""  # as ignite's test_launcher.py does for the scripts it starts
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_shim_sets_messages_aside(tmp_path: Path) -> None:
    """As a pytest plugin, the shim makes ``pytest.raises``/``pytest.warns`` check the type only:
    a test comparing ignite's wording passes on unirank's, a wrong type still fails."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_words.py").write_text(
        "import warnings\nimport pytest\n\n"
        "def test_other_words():\n"
        "    with pytest.raises(ValueError, match='ignite says'):\n"
        "        raise ValueError('unirank says')\n"
        "    with pytest.warns(UserWarning, match='ignite says'):\n"
        "        warnings.warn('unirank says', UserWarning)\n\n"
        "def test_other_type():\n"
        "    with pytest.raises(ValueError, match='ignite says'):\n"
        "        raise TypeError('ignite says')\n"
    )
    env = suite_environ(RUNS["one_process"], user_site(tmp_path / "userbase", "ignite"))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-c", "pytest.ini", "-p", "unirank_shim",
                           "-p", "no:cacheprovider", "-rA", "test_words.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert "PASSED test_words.py::test_other_words" in proc.stdout, proc.stdout
    assert "FAILED test_words.py::test_other_type" in proc.stdout, proc.stdout
