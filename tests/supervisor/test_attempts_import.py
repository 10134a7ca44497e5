"""The engine's import waits until the fork server has its environment.

The fork server imports torch only once :func:`unirank.supervisor.attempts.run_plan` sent it the
workers' common environment, so what ``unirank run`` imports before that delays every worker;
the engine (:mod:`unirank.supervisor.engine`) is imported after it, while the server imports.
"""

from __future__ import annotations

from tests._procs import assert_snippet_runs


def test_planning_a_run_does_not_import_the_engine() -> None:
    """What ``unirank run`` imports up to ``run_plan``'s call (its CLI modules, the attempts
    module, the engine's options) leaves :mod:`unirank.supervisor.engine` unimported."""
    assert_snippet_runs(
        "import sys\n"
        "import unirank.cli.run, unirank.cli.runconfig, unirank.cli.elastic\n"
        "from unirank.supervisor.attempts import EngineOptions, run_plan\n"
        "from unirank.supervisor.plan import make_plan\n"
        "EngineOptions()\n"
        "assert 'unirank.supervisor.engine' not in sys.modules, 'the engine was imported'\n")


def test_running_a_plan_imports_the_engine_once_configured() -> None:
    """``run_plan`` imports the engine after :func:`~unirank.supervisor.attempts.configure_server`
    (its source order; the run itself is tested end to end in tests/cli/test_run.py)."""
    import inspect

    from unirank.supervisor import attempts

    source = inspect.getsource(attempts.run_plan)
    assert source.index("configure_server(server") < source.index(
        "from unirank.supervisor.engine import") < source.index("_cannot_serve(server")
