"""Rules of the source's layout that keep each question in one home (read from src/ with
:mod:`ast`; nothing is imported or run):

* a Slurm variable is named only in ``launchers/slurm_vars.py``; everything else imports the name
  (a message or a job script's shell text builds its text from it too);
* a name look-up (``getaddrinfo``, ``gethostbyname``...) happens only in ``resolve.py``, where
  it is bounded by a timeout;
* ``os.environ`` is used only at the edges listed in :data:`ENVIRON_EDGES`: the modules where a
  process starts or where a public entry point reads the user's own process environment.
  Everything below takes a mapping (so its tests pass dicts).

Docstrings and comments are documentation and may name anything; a string in ``__all__`` is a
Python name, not a variable's.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from unirank.launchers import slurm_vars

SRC = Path(__file__).resolve().parents[1] / "src" / "unirank"
_SLURM_NAME = re.compile(r"\bSLURMD?_[A-Z][A-Z_]*")
#: the socket functions that ask the name service
_LOOKUPS = frozenset({"getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr",
                      "getnameinfo", "getfqdn"})
#: the os functions and names that read or write the process environment
_ENVIRON = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})

#: the modules that may use os.environ (paths under src/unirank; a folder allows all of it)
ENVIRON_EDGES = {
    # the command line: `unirank run|sbatch|check|doctor|bench...` read the user's shell
    "cli/": "a command's entry, where the user's shell environment comes in",
    # the worker process's entry: its private variables come in through its environment
    "supervisor/worker/bootstrap.py": "the worker process's entry (python -m ...bootstrap)",
    # the fork server and its children are processes whose environment is set from a request
    "supervisor/fork/server.py": "the fork server's entry: takes the job's environment",
    "supervisor/fork/child.py": "a forked worker's entry: sets its own environment",
    # `python -m unirank.sbatch.jobenv` runs in the batch shell
    "sbatch/jobenv.py": "the batch shell's helper (python -m unirank.sbatch.jobenv)",
    # public API called inside the user's program: the program's own environment is the input
    "launchers/__init__.py": "ur.detect() / explain() with no mapping read the program's",
    "runtime/state.py": "the first ur.* call detects the launcher from the program's",
    "runtime/lifecycle.py": "ur.init() reads the program's environment",
    "runtime/parallel.py": "ur.Parallel starts workers from the program's environment",
    "runtime/preemption.py": "ur.stop_requested/time_left/exit_for_requeue with no environ=",
    "runtime/snapshots.py": "ur.save_state/load_state find the run's memory in the program's",
    "errorfile.py": "the error file the program's environment names when it dies",
    # libraries that read only the process environment are configured through it
    "runtime/backends/horovod.py": "Horovod's C library reads HOROVOD_* from the process",
    "runtime/backends/xla.py": "torch_xla reads PJRT_DEVICE from the process",
    "hang/recorder.py": "torch reads the flight recorder's size from the C environment",
}


def _documentation(tree: ast.AST) -> set[int]:
    """The ids of the string constants that are documentation: a statement that is only a
    string (docstrings, attribute docs) and the strings of ``__all__``."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            ids.add(id(node.value))
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            ids.update(id(n) for n in ast.walk(node.value))
    return ids


def slurm_names(source: str) -> list[str]:
    """Every Slurm variable name spelled in a string of ``source`` (not documentation)."""
    tree = ast.parse(source)
    documentation = _documentation(tree)
    return [name for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in documentation
            for name in _SLURM_NAME.findall(node.value)]


def _used(source: str, module: str, names: frozenset[str]) -> list[str]:
    """``module.NAME`` attributes and ``from module import NAME`` of ``names`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr in names
                and isinstance(node.value, ast.Name) and node.value.id == module):
            found.append(f"{module}.{node.attr}")
        if isinstance(node, ast.ImportFrom) and node.module == module:
            found.extend(f"{module}.{a.name}" for a in node.names if a.name in names)
    return found


def _sources() -> dict[str, str]:
    return {path.relative_to(SRC).as_posix(): path.read_text() for path in SRC.rglob("*.py")}


def _allowed(path: str) -> bool:
    return any(path == edge or (edge.endswith("/") and path.startswith(edge))
               for edge in ENVIRON_EDGES)


def test_slurm_variables_are_named_only_in_slurm_vars() -> None:
    elsewhere = {path: names for path, text in _sources().items()
                 if path != "launchers/slurm_vars.py" and (names := slurm_names(text))}
    assert elsewhere == {}


def test_slurm_vars_names_every_variable_unirank_reads() -> None:
    defined = {name for value in vars(slurm_vars).values()
               for name in ((value,) if isinstance(value, str) else value
                            if isinstance(value, tuple) else ())
               if isinstance(name, str) and _SLURM_NAME.fullmatch(name)}
    assert {"SLURM_JOB_ID", "SLURM_JOBID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT",
            "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_END_TIME",
            "SLURM_GPUS_PER_TASK", "SLURMD_TRES_BIND", "SLURMD_NODENAME"} <= defined


@pytest.mark.parametrize(("source", "found"), [
    ('x = environ.get("SLURM_JOB_ID")', ["SLURM_JOB_ID"]),
    ("hint = f'pass --node_rank $SLURM_NODEID, {x}'", ["SLURM_NODEID"]),
    ('"""Reads: SLURM_JOB_ID."""\nx = 1\n"""SLURMD_NODENAME: documented."""', []),
    ('__all__ = ["SLURM_VARIABLES"]', []),
    ("name = 'SLURMD_TRES_BIND'  # SLURM_NTASKS in a comment", ["SLURMD_TRES_BIND"]),
])
def test_the_slurm_rule_sees_strings_but_not_documentation(source: str,
                                                           found: list[str]) -> None:
    assert slurm_names(source) == found


def test_name_look_ups_happen_only_in_resolve() -> None:
    elsewhere = {path: used for path, text in _sources().items()
                 if path != "resolve.py" and (used := _used(text, "socket", _LOOKUPS))}
    assert elsewhere == {}
    assert _used(_sources()["resolve.py"], "socket", _LOOKUPS)  # the one home is still there


def test_os_environ_is_used_only_at_the_edges() -> None:
    """Each edge says why in :data:`ENVIRON_EDGES`; a module below them takes a mapping."""
    sources = _sources()
    below = {path: used for path, text in sources.items()
             if not _allowed(path) and (used := _used(text, "os", _ENVIRON))}
    assert below == {}
    unused = [edge for edge in ENVIRON_EDGES
              if not any(_allowed(path) and path.startswith(edge.rstrip("/"))
                         and _used(text, "os", _ENVIRON) for path, text in sources.items())]
    assert unused == []  # an edge that no longer reads it leaves the list


@pytest.mark.parametrize(("source", "found"), [
    ("import os\nx = os.environ.get('A')", ["os.environ"]),
    ("from os import environ, getenv", ["os.environ", "os.getenv"]),
    ("import os\nos.putenv('A', 'b')", ["os.putenv"]),
    ('"""Reads os.environ."""\nenviron = {}', []),
])
def test_the_environ_rule_sees_uses_but_not_documentation(source: str, found: list[str]) -> None:
    assert _used(source, "os", _ENVIRON) == found
