"""The public API's vocabulary (issue 33): ``ur.launch`` takes its own options by name and
``fn``'s arguments as ``args=``/``kwargs=`` (or the older form, never both); the init timeout
is ``init_timeout`` everywhere, ignite's ``timeout=`` is accepted where ignite has it, and an
error names the keyword the caller used. Pure or in this process, no group started.

Environment variables read: none (the calls under test get their values as arguments).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

import unirank as ur
from unirank.errors import ConfigError
from unirank.runtime.ignite_options import init_timeout_given
from unirank.runtime.launchcall import OPTIONS, fn_arguments


def test_fn_s_arguments_come_by_args_and_kwargs_or_the_older_form() -> None:
    assert fn_arguments((), {}, (1, 2), {"lr": 0.1}) == ((1, 2), {"lr": 0.1})
    assert fn_arguments((1, 2), {"lr": 0.1}, None, None) == ((1, 2), {"lr": 0.1})
    assert fn_arguments((1,), {}, None, {"backend": "x"}) == ((1,), {"backend": "x"})
    assert fn_arguments((), {"lr": 1}, [3], None) == ((3,), {"lr": 1})


@pytest.mark.parametrize(("positional", "keywords", "args", "kwargs", "start"), [
    ((1,), {}, (2,), None, "args='(2,)': is given together with positional arguments"),
    ((), {"lr": 1}, None, {"lr": 2}, "kwargs=\"{'lr': 2}\": is given together with fn's keywords"),
    ((), {}, "ab", None, "args=\"'ab'\": must be a tuple or list"),
    ((), {}, 5, None, "args='5': must be a tuple or list"),
    ((), {}, None, [("a", 1)], "kwargs=\"[('a', 1)]\": must be a dict"),
])
def test_two_forms_at_once_or_a_wrong_shape_is_one_line(
        positional: tuple[int, ...], keywords: dict[str, int], args: object, kwargs: object,
        start: str) -> None:
    with pytest.raises(ConfigError) as caught:
        fn_arguments(positional, keywords, args, kwargs)  # type: ignore[arg-type]
    assert str(caught.value).startswith(start) and "\n" not in str(caught.value)


def test_launch_s_options_are_its_keywords_not_fn_s() -> None:
    import inspect

    keywords = {name for name, p in inspect.signature(ur.launch).parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords == set(OPTIONS)
    assert {"hang_report_after", "hang_timeout", "init_timeout"} <= keywords


def test_the_init_timeout_keyword_given_is_the_one_named() -> None:
    assert init_timeout_given(None, None) == (None, "init_timeout")
    assert init_timeout_given(30, None) == (30, "init_timeout")
    assert init_timeout_given(None, 30) == (30, "timeout")
    assert init_timeout_given(None, timedelta(minutes=1)) == (60.0, "timeout")
    assert init_timeout_given(timedelta(seconds=5), None) == (5.0, "init_timeout")
    with pytest.raises(ConfigError, match=r"^init_timeout='3': is given twice"):
        init_timeout_given(3, 4)


@pytest.mark.parametrize(("call", "start"), [
    (lambda: ur.init(timeout=-1), "timeout='-1': must be"),
    (lambda: ur.init(init_timeout=-1), "init_timeout='-1': must be"),
    (lambda: ur.Parallel("gloo", timeout=-2), "timeout='-2': must be"),
    (lambda: ur.Parallel("gloo", init_timeout="soon"), "init_timeout='soon': is not"),
    (lambda: ur.launch(len, nproc_per_node=2, init_timeout=0), "init_timeout='0': must be"),
])
def test_an_init_timeout_error_names_the_keyword_used(call: object, start: str) -> None:
    with pytest.raises(ConfigError) as caught:
        call()  # type: ignore[operator]
    assert str(caught.value).startswith(start)


def test_workers_stopped_by_a_forwarded_sigterm_end_the_script_with_143_naming_their_ranks(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``ur.launch`` after this process got SIGTERM: the stop named, with real ranks (not
    ``local rank -1 (rank -1) exited with code 143``), and the script ends with 128 + SIGTERM
    as ``unirank run`` does (tests/runtime/test_parallel_stop.py runs it for real)."""
    import signal

    from unirank.runtime.parallel import _raise_failure
    from unirank.supervisor.summary import RunResult, WorkerExit

    result = RunResult(exits=(WorkerExit(1, 1, "n", -15, stopped=True),
                              WorkerExit(0, 0, "n", -15, stopped=True)),
                       stop_signal=int(signal.SIGTERM))
    with pytest.raises(SystemExit) as caught:
        _raise_failure(result)
    assert caught.value.code == 143
    err = capsys.readouterr().err
    assert "stopped by SIGTERM (exit code 143)" in err
    assert "ranks 0-1" in err and "rank -1" not in err
