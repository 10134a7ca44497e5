"""Whether ``unirank run``'s target can be started, checked before any worker is.

``python`` refuses a missing script in one line before it runs anything; ``unirank run`` does the
same, once, instead of starting every worker to watch each fail:

* ``SCRIPT``: ``can't open file '/abs/SCRIPT': [Errno 2] No such file or directory``, exit code 2,
  as ``python SCRIPT`` (a folder or a zip file is left to the workers' ``python``, which runs its
  ``__main__``).
* ``-m MODULE``: ``No module named MODULE``, exit code 1, in ``python -m MODULE``'s words. Only
  the top-level package is looked up (in the current folder, which ``python -m`` puts first on
  ``sys.path``, and on this interpreter's path): finding ``pkg.sub`` would import ``pkg``, and
  with it perhaps torch, which the parent never does. A missing submodule is reported by the
  workers.
* ``--no-python PROGRAM``: ``PROGRAM: command not found`` (exit code 127) when it is not on PATH,
  ``PROGRAM: No such file or directory`` (127) or ``PROGRAM: Permission denied`` (126) for a path,
  as a shell says.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["TargetProblem", "check_target"]


@dataclass(frozen=True)
class TargetProblem:
    """Why the target cannot start: the line to print (after ``unirank run: ``), the exit code."""

    message: str
    exit_code: int


def check_target(program: str, *, module: bool, no_python: bool, cwd: str,
                 environ: Mapping[str, str]) -> TargetProblem | None:
    """The problem with starting ``program``, or None when it can be started.

    Reads PATH (from ``environ``, for ``no_python``).
    """
    if no_python:
        return _check_program(program, cwd, environ.get("PATH", os.defpath))
    if module:
        return _check_module(program, cwd)
    return _check_script(program, cwd)


def _check_script(script: str, cwd: str) -> TargetProblem | None:
    path = os.path.abspath(os.path.join(cwd, script))
    if os.path.isdir(path):
        return None
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        return TargetProblem(f"can't open file {path!r}: [Errno {exc.errno}] {exc.strerror}", 2)
    return None


def _check_module(name: str, cwd: str) -> TargetProblem | None:
    top = name.split(".", 1)[0]
    if not top:
        return TargetProblem("Relative module names not supported", 1)
    if (importlib.machinery.PathFinder.find_spec(top, [cwd]) is not None
            or importlib.util.find_spec(top) is not None):
        return None
    if top == name:
        return TargetProblem(f"No module named {name}", 1)
    return TargetProblem(f"Error while finding module specification for {name!r} "
                         f"(ModuleNotFoundError: No module named {top!r})", 1)


def _check_program(program: str, cwd: str, search_path: str) -> TargetProblem | None:
    if "/" not in program:
        if shutil.which(program, path=search_path) is None:
            return TargetProblem(f"{program}: command not found", 127)
        return None
    path = os.path.join(cwd, program)
    if not os.path.exists(path):
        return TargetProblem(f"{program}: No such file or directory", 127)
    if os.path.isdir(path):
        return TargetProblem(f"{program}: Is a directory", 126)
    if not os.access(path, os.X_OK):
        return TargetProblem(f"{program}: Permission denied", 126)
    return None
