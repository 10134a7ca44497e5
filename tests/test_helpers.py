"""Guards that keep the tests' shared helpers (tests/_procs.py) the one answer to their question:
the environment without launcher variables (``launcher_free_environ``), starting ``python -m
unirank run`` (``Runner``), and "is this a CI run" (``in_ci``, ``unavailable``). Each reads the
test sources as text."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
HELPERS = TESTS / "_procs.py"

#: a call that starts this interpreter's ``unirank run`` from a literal command line
_STARTS_UNIRANK_RUN = re.compile(
    r"(subprocess\.(run|Popen)|run_to_end|\.srun|\.salloc)\(\s*\[[^\]]*"
    r"\"-m\",\s*\"unirank\",\s*\"run\"")
#: an own copy of the launcher-free environment: a filter on launcher prefixes, or a helper
#: under one of the names it had
_OWN_ENVIRONMENT = re.compile(
    r"environ\.items\(\)[^\n]*startswith\(|startswith\(\(\s*\"(SLURM|SBATCH|OMPI|PMI)|"
    r"def (clean_env|clean_environ|local_env|local_environ|job_env|launcher_free_env)\("
    r"[^)]*\) -> dict")
#: a reading of ``CI``
_READS_CI = re.compile(r"(\.get\(|\[)\s*\"CI\"")


def _sources() -> dict[str, str]:
    """Every test source but the helpers' own and this file, by its path under tests/."""
    return {str(path.relative_to(TESTS)): path.read_text()
            for path in sorted(TESTS.rglob("*.py"))
            if path not in (HELPERS, Path(__file__).resolve())}


def _offenders(pattern: re.Pattern[str]) -> list[str]:
    return [name for name, text in _sources().items() if pattern.search(text)]


#: files that start ``unirank run`` themselves, and why
_OWN_START = {
    # torch's launcher tests call torch.distributed.run.main in-process: the shim must start
    # ``unirank run`` in its place with the arguments they give
    "torchrun_suite/unirank_torchrun_shim.py",
    # the Ray lane's reference run (same function under unirank run -n 2); to move to Runner
    "integration/test_ray.py",
}


def test_unirank_run_is_started_through_runner_only() -> None:
    assert [name for name in _offenders(_STARTS_UNIRANK_RUN) if name not in _OWN_START] == []


def test_no_test_builds_its_own_launcher_free_environment() -> None:
    assert _offenders(_OWN_ENVIRONMENT) == []


def test_only_the_helpers_read_ci() -> None:
    assert _offenders(_READS_CI) == []
    assert _READS_CI.search(HELPERS.read_text())


def test_the_guards_see_what_they_forbid() -> None:
    """Each pattern matches the spelling it stands for (so an empty list above means something)."""
    assert _STARTS_UNIRANK_RUN.search(
        'subprocess.run([sys.executable, "-m", "unirank", "run", *args], cwd=cwd)')
    assert _STARTS_UNIRANK_RUN.search(
        'slurm_testbed.srun(["-N2", sys.executable, "-m", "unirank", "run", "-n", "2"])')
    assert _OWN_ENVIRONMENT.search(
        'env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "X"))}')
    assert _OWN_ENVIRONMENT.search("def clean_env(**extra: str) -> dict[str, str]:")
    assert _READS_CI.search('os.environ.get("CI", "")')
