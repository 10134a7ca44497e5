"""What goes to a spawned worker by value (runtime/byvalue.py), and the call file that carries
it (runtime/worker.py): pure, in this process."""

from __future__ import annotations

import pickle
import sys
import threading
from pathlib import Path

import pytest

from unirank.errors import ConfigError
from unirank.runtime import byvalue
from unirank.runtime.worker import Call, read_results, write_result

SCRIPT = __file__


def _in_main(fn):  # type: ignore[no-untyped-def]
    """``fn`` as if defined at the prompt (its module ``__main__``)."""
    fn.__module__ = "__main__"
    fn.__qualname__ = fn.__name__
    return fn


def test_a_main_is_interactive_without_a_module_name_or_a_file(tmp_path: Path) -> None:
    assert byvalue.interactive_main({})  # a notebook, the prompt, python -c
    assert byvalue.interactive_main({"init_main_from_path": str(tmp_path / "<stdin>")})
    assert not byvalue.interactive_main({"init_main_from_path": SCRIPT})
    assert not byvalue.interactive_main({"init_main_from_name": "pkg.tool"})
    # stdin's "<stdin>" path is dropped for the worker (spawn would fail on it); a file stays
    assert "init_main_from_path" not in byvalue.worker_preparation(
        {"init_main_from_path": "/nowhere/<stdin>", "dir": "/"})
    assert byvalue.worker_preparation({"init_main_from_path": SCRIPT}) == {
        "init_main_from_path": SCRIPT}


def test_the_main_objects_a_call_uses_are_found_in_its_arguments_too() -> None:
    @_in_main
    def train(rank: int) -> int:
        return rank

    class Model:
        pass

    Model.__module__, Model.__qualname__ = "__main__", "Model"
    call = Call(len, ([1, {"model": Model()}],), {"fn": train})
    assert sorted(byvalue.main_objects(call)) == ["Model", "train"]
    assert byvalue.main_objects(Call(len, (1,))) == []


def test_what_main_defines_goes_by_value_and_the_worker_runs_main_only_by_reference() -> None:
    # (by_value, import_main)
    for interactive in (True, False):
        for cloudpickle in (True, False):
            assert byvalue.shipping([], interactive=interactive,
                                    cloudpickle=cloudpickle) == (False, False)
    assert byvalue.shipping(["train"], interactive=True, cloudpickle=True) == (True, False)
    assert byvalue.shipping(["train"], interactive=True, cloudpickle=False) == (True, False)
    # a script's top-level function: by value like a notebook's; by name without cloudpickle
    assert byvalue.shipping(["train"], interactive=False, cloudpickle=True) == (True, False)
    assert byvalue.shipping(["train"], interactive=False, cloudpickle=False) == (False, True)


def test_the_worker_s_preparation_keeps_main_only_when_it_imports_it() -> None:
    both = {"init_main_from_path": SCRIPT, "init_main_from_name": "pkg.tool", "dir": "/"}
    assert byvalue.worker_preparation(both, import_main=False) == {"dir": "/"}
    assert byvalue.worker_preparation(both, import_main=True) == both


def test_a_script_s_lambda_without_cloudpickle_names_cloudpickle(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fn = _in_main(lambda r: r)
    fn.__qualname__ = "<lambda>"
    with pytest.raises(ConfigError) as caught:
        byvalue.dumps(fn, by_value=False, what="the function <lambda>", names=["<lambda>"])
    text = str(caught.value)
    assert "is defined in the script's __main__ and cannot be pickled by name" in text
    assert "module level" not in text and text.endswith(f"HINT: {byvalue.EXTRA_HINT}")


def test_by_value_pickles_with_cloudpickle_and_loads_with_pickle() -> None:
    cloudpickle = pytest.importorskip("cloudpickle")
    assert cloudpickle is not None
    offset = 5
    fn = _in_main(lambda r: r + offset)
    data = byvalue.dumps(fn, by_value=True, what="fn")
    assert pickle.loads(data)(1) == 6
    with pytest.raises(pickle.PicklingError):
        pickle.dumps(fn)  # by reference it would not be found


def test_without_cloudpickle_the_error_names_what_needs_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cloudpickle", None)  # import cloudpickle fails
    with pytest.raises(ConfigError) as caught:
        byvalue.dumps(len, by_value=True, what="the function train", names=["train", "Net"])
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith("the function train (train, Net) is defined in a notebook cell")
    assert text.endswith(f"HINT: {byvalue.EXTRA_HINT}")


def test_what_cannot_be_pickled_is_one_line() -> None:
    with pytest.raises(ConfigError) as caught:
        byvalue.dumps(threading.Lock(), by_value=False, what="the return value")
    assert str(caught.value).startswith(
        "the return value cannot be pickled (TypeError: cannot pickle '_thread.lock' object)")


def test_return_values_are_read_by_local_rank(tmp_path: Path) -> None:
    call = Call(len, results=str(tmp_path))
    write_result(call, 1, {"loss": 0.5})
    write_result(call, 0, [1, 2])
    # local rank 2 wrote nothing (it ended through sys.exit(0)): None
    assert read_results(str(tmp_path), [0, 1, 2]) == [[1, 2], {"loss": 0.5}, None]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.pickle", "1.pickle"]


def test_by_value_keeps_the_function_s_file_for_tracebacks() -> None:
    pytest.importorskip("cloudpickle")
    fn = _in_main(lambda r: r + 1)
    loaded = pickle.loads(byvalue.dumps(fn, by_value=True, what="fn"))
    assert loaded.__code__.co_filename == __file__  # cloudpickle alone: "<dynamic-code>"
    assert loaded.__code__.co_firstlineno == fn.__code__.co_firstlineno
    assert loaded(1) == 2
