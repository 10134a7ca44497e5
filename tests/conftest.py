"""Shared pytest fixtures.

- ``runner``: a :class:`Runner` (tests/_procs.py) in the test's own folder, the one way a test
  starts ``python -m unirank run``; what it started is killed at the test's end.
- ``slurm_testbed`` (session): the real two-node Slurm cluster of ``scripts/testbed``, with helpers
  to run ``srun``/``salloc`` and ``sbatch`` jobs that always have a timeout and never stay queued.
- ``mpirun`` (session): the command prefix for Open MPI's ``mpirun``.
- ``ssh_testbed`` (session): ``unirank run --hosts``'s ssh options for the testbed's two nodes
  (one sshd each, started by ``scripts/testbed``).
- ``tmux`` (session): the path of tmux, a real terminal emulator (installed by ``scripts/testbed
  install`` as root when missing).
- SIGINT and SIGQUIT ignored by the shell that started the tests (no job control) go back to
  their defaults, so that every program a test starts takes a Ctrl-C as in a terminal.
- TMPDIR (tests/_tmpcheck.py): each pytest process (each xdist worker) has a folder of its own,
  checked at the end for what unirank runs left there (fails with ``CI=true``) and removed.

Rule (DEVELOPERS.md): with ``CI=true`` a testbed, mpirun or tmux that cannot be had is a test
failure; elsewhere (no root, no apt) the tests skip with a one-line reason (``unavailable`` and
``in_ci`` of tests/_procs.py).

Environment variables read: ``CI``, ``UNIRANK_TESTBED_LOGS`` (log folder of the testbed), and the
caller's environment, from which launcher variables (``SLURM_*``, ``OMPI_*``, ...) are removed
before starting Slurm commands so that a test never inherits an outer job's identity.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Optional

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# shared test helpers (tests/_procs.py) are importable from every test module
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _procs import Runner, free_port, launcher_free_environ, unavailable  # noqa: E402


def _cache_bytecode(environ: MutableMapping[str, str] = os.environ) -> None:
    """Where ``PYTHONDONTWRITEBYTECODE`` is set, write the bytecode caches outside the tree
    instead (``PYTHONPYCACHEPREFIX``, default ``$XDG_CACHE_HOME/unirank/pycache``), for this
    process and every one it starts: without them each pytest process (every xdist worker, each
    lane that runs pytest inside pytest) rewrites the asserts of every test module again (about
    30 s of CPU), and each of the thousands of interpreters the tests start compiles unirank
    again. The tree stays as clean as the setting asked. Reads ``PYTHONDONTWRITEBYTECODE``,
    ``PYTHONPYCACHEPREFIX``, ``XDG_CACHE_HOME``, ``HOME``."""
    if not environ.get("PYTHONDONTWRITEBYTECODE"):
        return
    cache_home = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    prefix = environ.get("PYTHONPYCACHEPREFIX") or os.path.join(cache_home, "unirank", "pycache")
    del environ["PYTHONDONTWRITEBYTECODE"]
    environ["PYTHONPYCACHEPREFIX"] = prefix
    sys.pycache_prefix = prefix
    sys.dont_write_bytecode = False


_cache_bytecode()
# A shell without job control (a script's ``cmd &``, nohup) starts its background jobs with
# SIGINT and SIGQUIT ignored, and an ignored disposition is inherited across exec: every
# program the tests start would then ignore the Ctrl-C the tests send it (a rank "that does not
# stop"). The tests stand for a terminal's Ctrl-C: those two go back to their defaults here,
# for this process and all it starts (a handled signal is reset to the default at exec).
for _stop in (signal.SIGINT, signal.SIGQUIT):
    if signal.getsignal(_stop) == signal.SIG_IGN:
        signal.signal(_stop, signal.default_int_handler if _stop == signal.SIGINT
                      else signal.SIG_DFL)

# each pytest process's own TMPDIR, checked at the end for what runs left (tests/_tmpcheck.py)
from _tmpcheck import pytest_configure, pytest_sessionfinish  # noqa: E402, F401

TESTBED = REPO_ROOT / "scripts" / "testbed"
# ignite's own tests, run by tests/runtime/test_ignite_suite.py in their own pytest processes
collect_ignore = ["ignite_suite", "torchrun_suite"]
# Every job this session starts carries the session's own tag, so that the end-of-session check
# for jobs left behind never sees (or cancels) another session's jobs on a shared testbed.
JOB_NAME_PREFIX = f"unirank-test-{uuid.uuid4().hex[:6]}-"
TESTBED_START_TIMEOUT_S = 900.0  # a fresh machine first runs apt-get install
TERMINAL_JOB_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)


class SlurmTimeout(AssertionError):
    """A Slurm command or job did not finish in time; it has been cancelled."""


@dataclasses.dataclass(frozen=True)
class BatchResult:
    """What an ``sbatch`` job left behind."""

    job_id: int
    state: str  # JobState from scontrol: COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    exit_code: int  # the batch script's exit status (first half of ExitCode=a:b)
    signal: int  # the signal that ended it, 0 if none (second half of ExitCode)
    output: str  # stdout and stderr of the batch script (sbatch -o)
    output_path: Path


def _minutes(timeout: float) -> int:
    """Slurm's --time in whole minutes, a little longer than the subprocess timeout."""
    return max(1, math.ceil(timeout / 60.0) + 1)


@dataclasses.dataclass
class SlurmTestbed:
    """Handle on the running two-node testbed (node1 at 127.0.1.1, node2 at 127.0.1.2).

    Tests cannot import this conftest (``--import-mode=importlib``): they reach the exception
    types through the fixture, e.g. ``pytest.raises(slurm_testbed.Timeout)``.
    """

    Timeout: ClassVar[type[SlurmTimeout]] = SlurmTimeout
    log_dir: Path
    work_dir: Path
    nodes: tuple[str, ...] = ("node1", "node2")

    # --- inspection ---------------------------------------------------------------------------

    def logs(self) -> str:
        """Tail of every testbed log (``scripts/testbed logs``)."""
        return _testbed_logs(self.log_dir)

    def node_states(self) -> dict[str, str]:
        """``{"node1": "idle", ...}`` as ``sinfo -N`` shows them."""
        out = _run_checked(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=30).stdout
        return dict(line.split(None, 1) for line in out.splitlines() if line.strip())

    def queued_test_jobs(self) -> list[str]:
        """Ids of jobs started by these helpers that squeue still holds, but for those ending
        already (COMPLETING: an srun that just returned leaves its job there a moment)."""
        out = _run_checked(["squeue", "-h", "-o", "%i %T %j"], timeout=30).stdout
        return [
            job_id
            for job_id, state, name in (line.split(" ", 2) for line in out.splitlines())
            if name.startswith(JOB_NAME_PREFIX) and state != "COMPLETING"
        ]

    # --- running jobs -------------------------------------------------------------------------

    def srun(
        self,
        args: Sequence[str],
        timeout: float = 60.0,
        env: Optional[Mapping[str, str]] = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``srun ARGS`` with ``--time`` and a subprocess timeout; cancel the job on timeout."""
        return self._run_job_command("srun", args, timeout, env, check)

    def salloc(
        self,
        args: Sequence[str],
        timeout: float = 60.0,
        env: Optional[Mapping[str, str]] = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``salloc ARGS`` (options then the command) like :meth:`srun`."""
        return self._run_job_command("salloc", args, timeout, env, check)

    def sbatch_and_wait(
        self,
        script_text: str,
        timeout: float = 60.0,
        args: Sequence[str] = (),
        env: Optional[Mapping[str, str]] = None,
    ) -> BatchResult:
        """Submit ``script_text`` with ``sbatch --parsable`` and wait until the job ends.

        ``args`` are extra sbatch options. On timeout the job is cancelled and
        :class:`SlurmTimeout` is raised; no job stays in the queue.
        """
        if not script_text.startswith("#!"):
            script_text = "#!/bin/bash\n" + script_text
        tag = uuid.uuid4().hex[:12]
        script = self.work_dir / f"batch-{tag}.sh"
        script.write_text(script_text)
        output_pattern = self.work_dir / f"batch-{tag}-%j.out"
        cmd = [
            "sbatch",
            "--parsable",
            f"--job-name={JOB_NAME_PREFIX}{tag}",
            f"--time={_minutes(timeout)}",
            f"--output={output_pattern}",
            f"--chdir={self.work_dir}",
            *args,
            str(script),
        ]
        submitted = _run_checked(cmd, timeout=30, env=launcher_free_environ(env))
        job_id = int(submitted.stdout.strip().split(";")[0])
        deadline = time.monotonic() + timeout
        fields: dict[str, str] = {}
        while True:
            fields = _job_fields(job_id)
            if fields.get("JobState", "UNKNOWN") in TERMINAL_JOB_STATES | {"UNKNOWN"}:
                break
            if time.monotonic() > deadline:
                _cancel([str(job_id)])
                raise SlurmTimeout(
                    f"sbatch job {job_id} still {fields.get('JobState')} after {timeout:g} s "
                    f"(reason {fields.get('Reason')}); cancelled\n{self.logs()}"
                )
            time.sleep(0.2)  # waiting on an external daemon: a bounded poll
        exit_code, _, signal = fields.get("ExitCode", "-1:0").partition(":")
        out_path = Path(str(output_pattern).replace("%j", str(job_id)))
        output = out_path.read_text(errors="replace") if out_path.exists() else ""
        return BatchResult(
            job_id=job_id,
            state=fields.get("JobState", "UNKNOWN"),
            exit_code=int(exit_code),
            signal=int(signal or 0),
            output=output,
            output_path=out_path,
        )

    def release_requeued(self, job_id: int, restarts: int = 1, timeout: float = 240.0) -> None:
        """Start a requeued job now instead of after Slurm's hold (about 120 s).

        Waits (bounded poll of ``scontrol show job``) until the job is PENDING with reason
        BeginTime and ``Restarts`` at least ``restarts``, then, as root, sets its StartTime to
        2 s from now (the job starts about 3 s later instead of 120 s). Fails when the job
        ends or leaves the queue first, or after ``timeout`` (the job is then cancelled).
        """
        deadline = time.monotonic() + timeout
        fields: dict[str, str] = {}
        while time.monotonic() < deadline:
            fields = _job_fields(job_id)
            state = fields.get("JobState", "UNKNOWN")
            if state in TERMINAL_JOB_STATES | {"UNKNOWN"}:
                raise AssertionError(f"job {job_id} ended ({state}, Restarts="
                                     f"{fields.get('Restarts')}) instead of waiting requeued")
            if (state == "PENDING" and fields.get("Reason") == "BeginTime"
                    and int(fields.get("Restarts", "0")) >= restarts):
                # now+2, not now: slurmd refuses a credential issued in the same second as
                # the previous run's revocation ("Job credential revoked") and slurmctld then
                # ends the job for good (seen on this testbed)
                _run_checked(["scontrol", "update", f"JobId={job_id}", "StartTime=now+2"],
                             timeout=30)
                return
            time.sleep(0.2)  # waiting on an external daemon: a bounded poll
        _cancel([str(job_id)])
        raise SlurmTimeout(f"job {job_id} not PENDING BeginTime with Restarts>={restarts} "
                           f"after {timeout:g} s (last: {fields.get('JobState')}, "
                           f"{fields.get('Reason')}); cancelled\n{self.logs()}")

    def _run_job_command(
        self,
        program: str,
        args: Sequence[str],
        timeout: float,
        env: Optional[Mapping[str, str]],
        check: bool,
    ) -> subprocess.CompletedProcess[str]:
        name = f"{JOB_NAME_PREFIX}{uuid.uuid4().hex[:12]}"
        cmd = [program, f"--job-name={name}", f"--time={_minutes(timeout)}", *args]
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=launcher_free_environ(env),
            cwd=self.work_dir,
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _cancel_by_name(name)
            try:
                stdout, stderr = proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, stderr = proc.communicate()
            raise SlurmTimeout(
                f"{' '.join(cmd)} did not finish in {timeout:g} s; job cancelled\n"
                f"stdout:\n{stdout}\nstderr:\n{stderr}"
            ) from None
        result = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)} exited {result.returncode}\nstdout:\n{stdout}\nstderr:\n{stderr}"
            )
        return result


def _run_checked(
    cmd: Sequence[str], timeout: float, env: Optional[Mapping[str, str]] = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        list(cmd),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(env) if env is not None else None,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {result.returncode}: {result.stderr.strip()}")
    return result


def _job_fields(job_id: int) -> dict[str, str]:
    """``scontrol show job -o`` as a dict; ``{}`` when the controller no longer knows the job."""
    result = subprocess.run(
        ["scontrol", "show", "job", "-o", str(job_id)],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        return {}
    return dict(re.findall(r"(\w+)=(\S*)", result.stdout))


def _wait_gone(job_ids: Sequence[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30
        ).stdout.split()
        if not set(job_ids) & set(out):
            return
        time.sleep(0.2)  # waiting on an external daemon: a bounded poll


def _cancel(job_ids: Sequence[str]) -> None:
    if job_ids:
        subprocess.run(["scancel", "--full", *job_ids], capture_output=True, timeout=30)
        _wait_gone(job_ids)


def _cancel_by_name(name: str) -> None:
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i", f"--name={name}"], capture_output=True, text=True, timeout=30
    ).stdout.split()
    _cancel(out)


def _testbed_logs(log_dir: Path) -> str:
    result = subprocess.run(
        [str(TESTBED), "logs"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "UNIRANK_TESTBED_LOGS": str(log_dir)},
    )
    return result.stdout + result.stderr


def _testbed(command: str, timeout: float, log_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TESTBED), command],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "UNIRANK_TESTBED_LOGS": str(log_dir)},
        stdin=subprocess.DEVNULL,
    )


def _default_log_dir() -> Path:
    return Path(os.environ.get("UNIRANK_TESTBED_LOGS", "/tmp/unirank-testbed/logs"))


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[Runner]:
    """A :class:`Runner` in the test's ``tmp_path``; kills what it started at the end."""
    made = Runner(tmp_path)
    yield made
    made.close()


@pytest.fixture
def served() -> Iterator[tuple[Any, int]]:
    """A rendezvous store served here on 127.0.0.1 on a free port, and that port."""
    from unirank.store import open_store

    port = free_port()
    store = open_store("127.0.0.1", port, rank=0, timeout=30, serve=True, hint="")
    yield store, port
    del store


@pytest.fixture(scope="session")
def slurm_testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmTestbed]:
    """The running two-node testbed, started once per session (reused when already up).

    Fails in CI and skips elsewhere when it cannot be had. Leaves the testbed running; at the
    end, any job the helpers left queued is cancelled and reported as an error.
    """
    log_dir = _default_log_dir()
    is_root = os.geteuid() == 0
    if shutil.which("sinfo") and _testbed("status", 60, log_dir).returncode == 0:
        pass  # already up (possibly started by someone else): reuse it
    elif not is_root:
        unavailable(
            "Slurm testbed not running and starting it needs root: sudo scripts/testbed start"
        )
    elif not (shutil.which("slurmctld") or shutil.which("apt-get")):
        unavailable("Slurm is not installed and apt-get is missing to install it")
    else:
        try:
            started = _testbed("start", TESTBED_START_TIMEOUT_S, log_dir)
        except subprocess.TimeoutExpired:
            unavailable(
                f"scripts/testbed start did not finish in {TESTBED_START_TIMEOUT_S:g} s",
                _testbed_logs(log_dir),
            )
        if started.returncode != 0:
            last = (started.stderr.strip().splitlines() or ["(no output)"])[-1]
            unavailable(
                f"scripts/testbed start failed: {last}",
                f"{started.stdout}{started.stderr}\n{_testbed_logs(log_dir)}",
            )
    testbed = SlurmTestbed(log_dir=log_dir, work_dir=tmp_path_factory.mktemp("slurm"))
    yield testbed
    left = testbed.queued_test_jobs()
    if left:
        _cancel(left)
        raise AssertionError(f"tests left Slurm jobs in the queue (now cancelled): {left}")


#: the testbed's ssh client configuration (scripts/testbed: root's key, known_hosts)
TESTBED_SSH_CONFIG = Path("/etc/unirank-testbed/ssh/config")


@pytest.fixture(scope="session")
def ssh_testbed(slurm_testbed: SlurmTestbed) -> list[str]:
    """``unirank run``'s options for reaching the testbed's node1 (127.0.1.1) and node2
    (127.0.1.2) over real ssh: ``--ssh-option '-F <the testbed's ssh config>'``. The sshds are
    started by ``scripts/testbed start`` with the rest of the testbed."""
    for node in ("node1", "node2"):
        try:
            done = subprocess.run(["ssh", "-F", str(TESTBED_SSH_CONFIG), "-o", "ConnectTimeout=5",
                                   node, "true"], stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            unavailable(f"ssh to the testbed's {node} failed: {exc}")
        if done.returncode != 0:
            unavailable(f"ssh to the testbed's {node} failed (scripts/testbed start sets up its "
                        f"sshd): {done.stderr.strip()}")
    return ["--ssh-option", f"-F {TESTBED_SSH_CONFIG}"]


@pytest.fixture(scope="session")
def mpirun() -> list[str]:
    """Command prefix for Open MPI's mpirun; installs Open MPI as root when it is missing.

    Fails in CI and skips elsewhere when mpirun cannot be had.
    """
    if shutil.which("mpirun") is None and os.geteuid() == 0 and shutil.which("apt-get"):
        _testbed("install", TESTBED_START_TIMEOUT_S, _default_log_dir())
    exe = shutil.which("mpirun")
    if exe is None:
        unavailable("mpirun not found: install Open MPI (apt-get install openmpi-bin)")
    version = subprocess.run(
        [exe, "--version"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
    )
    if "Open MPI" not in version.stdout + version.stderr:
        unavailable(f"{exe} is not Open MPI's mpirun")
    prefix = ["mpirun", "--oversubscribe"]
    if os.geteuid() == 0:
        prefix.insert(1, "--allow-run-as-root")
    return prefix


@pytest.fixture(scope="session")
def tmux() -> str:
    """The path of tmux (a real terminal emulator, with a scrollback); installs it as root
    when it is missing (``scripts/testbed install``).

    Fails in CI and skips elsewhere when tmux cannot be had.
    """
    if shutil.which("tmux") is None and os.geteuid() == 0 and shutil.which("apt-get"):
        _testbed("install", TESTBED_START_TIMEOUT_S, _default_log_dir())
    exe = shutil.which("tmux")
    if exe is None:
        unavailable("tmux not found: install it (apt-get install tmux, or scripts/testbed "
                    "install as root)")
    return exe


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the testbed ``slurm`` and every one that uses mpirun ``mpi``;
    put the Slurm jobs in one xdist group; order the run (:func:`_tier`). First: xdist reads the
    groups in its own hook."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "slurm_testbed" in names and item.get_closest_marker("slurm") is None:
            item.add_marker(pytest.mark.slurm)
        if "mpirun" in names and item.get_closest_marker("mpi") is None:
            item.add_marker(pytest.mark.mpi)
        group = _xdist_group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    tiers = {item.nodeid: _tier(item) for item in items}
    for item in items:
        if tiers[item.nodeid] == 0 and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(LONG_TEST_TIMEOUT_S))
    items.sort(key=lambda item: tiers[item.nodeid])  # stable: within a tier, the files' order


#: the per-test timeout (pytest-timeout) of :data:`LONG_TESTS` and the Slurm group; every other
#: test has pyproject.toml's ``timeout``, so that a stuck test fails naming itself
LONG_TEST_TIMEOUT_S = 1800
#: the xdist group of the tests that submit Slurm jobs: the testbed's two nodes (4 cores and 2
#: GPUs each) hold one test's jobs at a time, and a test that waits for its job to start must
#: not wait behind another test's (README's command runs ``--dist loadgroup``)
SLURM_GROUP = "slurm-testbed"
#: the tests that take minutes on their own (pytest inside pytest, the peers' suites): started
#: first, so that a parallel run never ends waiting for one of them alone
LONG_TESTS = ("test_unirank_passes_its_unit_tests_on_torch_2_9",
              "test_the_suites_pass_without_the_fork_server", "test_ignite_suite",
              "test_torchrun_suite", "test_ray_train_function_trains_to_the_unirank_run_loss")


def _needs_the_slurm_queue(item: pytest.Item) -> bool:
    """A test that submits Slurm jobs (not one that only reaches the testbed's sshds)."""
    names = getattr(item, "fixturenames", ())
    return "slurm_testbed" in names and "ssh_testbed" not in names


def _xdist_group(item: pytest.Item) -> str:
    """The xdist group that ``item`` must share a worker with, or "": the Slurm queue's, or its
    module's where it uses a module-scoped fixture (set up once for the module, as in a serial
    run: ignite's suite, a trained model, a preempted job)."""
    if _needs_the_slurm_queue(item):
        return SLURM_GROUP
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info else ()):
        if any(fixturedef.scope == "module" for fixturedef in defs):
            return f"module:{item.nodeid.split('::')[0]}"
    return ""


def _tier(item: pytest.Item) -> int:
    """The run's order, one tier after another: 0 the Slurm group and the long tests (each one
    unit that a worker runs alone: started first, they do not end the run late), 1 the pure
    tests (no ``integration`` marker: seconds in all, their failures seen first), 2 the tests
    that start real processes."""
    if _needs_the_slurm_queue(item) or any(name in item.nodeid for name in LONG_TESTS):
        return 0
    return 2 if item.get_closest_marker("integration") else 1


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attach the testbed's logs to the report of a failed test that used the testbed."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and "slurm_testbed" in getattr(item, "fixturenames", ()):
        try:
            report.sections.append(("slurm testbed logs", _testbed_logs(_default_log_dir())))
        except (OSError, subprocess.SubprocessError) as exc:
            report.sections.append(("slurm testbed logs", f"could not read logs: {exc}"))


XLA_PYTHON = REPO_ROOT / ".venv-xla" / "bin" / "python"


@pytest.fixture(scope="session")
def horovodrun() -> str:
    """The ``horovodrun`` of the Horovod that ``scripts/setup --horovod`` installs in this Python.

    Fails in CI and skips elsewhere when Horovod is not installed.
    """
    probe = subprocess.run([sys.executable, "-c", "import horovod.torch"], capture_output=True,
                           text=True, timeout=120, stdin=subprocess.DEVNULL)
    if probe.returncode != 0:
        unavailable("Horovod is not installed in this Python: run scripts/setup --horovod",
                    probe.stderr[-2000:])
    exe = Path(sys.executable).parent / "horovodrun"
    if not exe.exists():
        found = shutil.which("horovodrun")
        if found is None:
            unavailable("horovodrun not found next to this Python: run scripts/setup --horovod")
        return found
    return str(exe)


@pytest.fixture(scope="session")
def xla_python() -> str:
    """The Python of ``.venv-xla`` (torch 2.9.0 and torch_xla 2.9.0, ``scripts/setup --xla``).

    Fails in CI and skips elsewhere when it is missing or cannot import torch_xla and unirank.
    """
    if not XLA_PYTHON.exists():
        unavailable(f"{XLA_PYTHON.relative_to(REPO_ROOT)} is missing: run scripts/setup --xla")
    probe = subprocess.run(
        [str(XLA_PYTHON), "-c", "import torch_xla, unirank"], capture_output=True, text=True,
        timeout=300, stdin=subprocess.DEVNULL, env=launcher_free_environ({"PJRT_DEVICE": "CPU"}),
    )
    if probe.returncode != 0:
        unavailable(".venv-xla cannot import torch_xla and unirank: run scripts/setup --xla",
                    probe.stderr[-2000:])
    return str(XLA_PYTHON)
