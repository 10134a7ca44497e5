"""Who imports whom in src/unirank, read from the source (every ``import`` statement, at the top
of a module or inside a function): nothing outside ``sbatch/`` imports ``sbatch/`` (the runtime
and the supervisor take the exit codes from ``exitcodes``, the requeue's pure parts from
``requeue``, Slurm's commands from ``slurmcmd``), and no two modules import each other, however
long the way round."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "unirank"

#: modules outside sbatch/ that may import it, and why
SBATCH_USERS = {
    "unirank.cli.sbatch": "the `unirank sbatch` command line itself",
    "unirank.jobenv": "`python -m unirank.jobenv`, kept for batch scripts of earlier versions",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The unirank modules ``name`` imports (``from a import b``: ``a.b`` when that is a
    module, else ``a``)."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                whole = f"{base}.{alias.name}"
                found.add(whole if whole in known else base)
    return {m for m in found if m in known and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def test_nothing_outside_sbatch_imports_sbatch() -> None:
    found = {name: sorted(m for m in deps if m.startswith("unirank.sbatch"))
             for name, deps in _graph().items()
             if not name.startswith("unirank.sbatch") and name not in SBATCH_USERS}
    assert {name: deps for name, deps in found.items() if deps} == {}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm), each
    sorted; a package's ``__init__`` importing its own modules is not a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def _without_package_inits(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """A module's import of a package it lives in, or of a package's ``__init__`` re-exporting
    its own submodules, is left out: the package's own ``__init__`` is run first either way
    (``import a.b`` runs ``a/__init__``), which is no circle of the code's."""
    return {name: {m for m in deps if not name.startswith(m + ".") and not m.startswith(name + ".")}
            for name, deps in graph.items()}


def test_the_circle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


#: circles being cut on another branch: allowed until it lands (none now)
BEING_CUT: list[list[str]] = []


def test_no_import_circle_in_src() -> None:
    """Issue 33: cli/doctor <-> cli/doctorhosts (``emit`` now in doctor.result) and netroute
    <-> resolve (this host's addresses now in hostaddrs, which looks nothing up)."""
    assert [c for c in _cycles(_without_package_inits(_graph())) if c not in BEING_CUT] == []
