"""docs/architecture.md names only what exists: every backticked dotted name in the "One home
for each rule" table's home column is a module of ``unirank`` or a symbol in one (a name
with a leading module, ``module.symbol`` or ``module.Class.attr``), and every ``folder/file``
the module map and the path diagram name is a file of src/unirank."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()
SRC = ROOT / "src" / "unirank"


def _table_homes() -> list[str]:
    table = DOC.split("## One home for each rule", 1)[1].split("\n## ", 1)[0]
    names: list[str] = []
    for row in table.splitlines():
        cells = row.split("|")
        if len(cells) < 4 or cells[2].strip() in ("home", "---"):
            continue
        found = re.findall(r"`([a-z_]\w*(?:\.[A-Za-z_]\w*)+)`", cells[2])
        names += [n for n in found if not n.endswith(".py")]  # Class.attr: named with its module
    return names


def _resolve(dotted: str) -> bool:
    """Import the longest module prefix of ``unirank.<dotted>``, then look up the rest."""
    if dotted.startswith("ur."):  # import unirank as ur
        dotted = dotted[3:]
    parts = f"unirank.{dotted}".split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _process_names() -> list[str]:
    table = DOC.split("### The processes", 1)[1].split("\n\n(a)", 1)[0]
    found = re.findall(r"`([a-z_]\w*(?:\.[A-Za-z_]\w*)+)`", table)
    return [n for n in found if not n.endswith(".py") and not n.startswith(("os.", "sys."))]


def test_the_table_of_processes_names_what_exists() -> None:
    names = _process_names()
    assert len(names) > 30, names
    missing = [n for n in names if not _resolve(n)]
    assert not missing, f"architecture.md's processes name what does not exist: {missing}"


def test_the_one_home_table_names_what_exists() -> None:
    names = _table_homes()
    assert len(names) > 50, names  # the table was read
    missing = [n for n in names if not _resolve(n)]
    assert not missing, f"architecture.md names what does not exist: {missing}"


def test_the_module_paths_named_exist() -> None:
    """``supervisor/worker/main``, ``cli/runoptions.py``, ``runtime/parallel.py``: files or
    folders under src/unirank (with or without ``.py``)."""
    folders = "cli|supervisor|runtime|hang|sbatch|launchers"
    paths = set(re.findall(rf"(?<![\w/])((?:{folders})/[\w/]+)(?:\.py)?", DOC))
    paths.discard("sbatch/scontrol/sacct/scancel/squeue")  # the Slurm commands, not a path
    missing = [p for p in sorted(paths)
               if not (SRC / f"{p}.py").exists() and not (SRC / p).is_dir()]
    assert not missing, f"architecture.md names paths that do not exist: {missing}"


#: the processes the table of processes says import no torch: the parent, PID 1's init, the
#: rendezvous helper, the stop-report and give-up children, the ssh fan-out, the helper start
NO_TORCH = ("unirank.cli.main", "unirank.cli.run", "unirank.supervisor.pidone",
            "unirank.supervisor.rdzv.agent", "unirank.supervisor.rdzv.server",
            "unirank.hang.onstop", "unirank.supervisor.giveup", "unirank.supervisor.helper",
            "unirank.supervisor.ssh.fanout", "unirank.supervisor.filetimer")


def test_parent_side_modules_import_no_torch() -> None:
    """A fresh interpreter imports each (the fork server imports torch only when it runs)."""
    code = ("import sys\nfor m in sys.argv[1:]:\n    __import__(m)\n"
            "    assert 'torch' not in sys.modules, m\n")
    done = subprocess.run([sys.executable, "-c", code, *NO_TORCH], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def test_no_supervisor_module_but_the_workers_imports_torch() -> None:
    """The rule "nothing in `supervisor/` but `fork/server.py`, `fork/child.py` and `worker/`
    imports torch at module level" (architecture.md's Rules)."""
    allowed = ("supervisor/fork/server.py", "supervisor/fork/child.py", "supervisor/worker/")
    names = sorted(
        ".".join(("unirank", *p.relative_to(SRC).with_suffix("").parts))
        for p in (SRC / "supervisor").rglob("*.py")
        if p.name != "__init__.py" and not p.relative_to(SRC).as_posix().startswith(allowed))
    assert len(names) > 30, names
    code = ("import sys\nfor m in sys.argv[1:]:\n    __import__(m)\n"
            "    assert 'torch' not in sys.modules, m\n")
    done = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
