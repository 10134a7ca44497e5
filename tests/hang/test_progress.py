"""A rank's progress record from a flight recorder dump (its shape as torch 2.13 gives it
under gloo), the user's frame of a stack, and the hang settings' parsing."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from unirank.contract import HangSettings, resolve_hang
from unirank.errors import ConfigError
from unirank.hang.progress import (
    describe_tensors,
    frames_of,
    group_progress,
    site_of,
    thread_stacks,
    user_frame,
)


def entry(seq: int, name: str, retired: bool, pg: int = 0) -> dict[str, object]:
    return {"collective_seq_id": seq, "input_dtypes": ["Float"], "input_sizes": [[4]],
            "is_p2p": False, "pg_id": pg, "process_group": [str(pg), "default_pg"],
            "profiling_name": f"gloo:{name}", "retired": retired, "state": "scheduled",
            "thread_id": "1234", "time_created_ns": 1795654767909491019}


def test_group_progress_names_the_last_entered_collective() -> None:
    dump = {"pg_status": {"0": {"last_completed_collective": "1",
                                "last_enqueued_collective": "2",
                                "last_started_collective": "-1"}},
            "entries": [entry(1, "all_reduce", True), entry(2, "broadcast", False)],
            "pg_config": {"default_pg": {"name": "0", "desc": "default_pg",
                                         "ranks": "[0, 1]"}}}
    [group] = group_progress(dump, default_world=2)
    assert group == {"pg": "0", "entered": 2, "done": 1, "op": "broadcast",
                     "what": "float32[4]", "since": 1795654767.909491, "thread": "1234",
                     "ranks": None, "calls": [[1, "all_reduce", "float32[4]", ""],
                                              [2, "broadcast", "float32[4]", ""]]}


def test_a_subgroup_lists_its_ranks_and_an_unused_group_is_left_out() -> None:
    dump = {"pg_status": {"1": {"last_completed_collective": "0",
                                "last_enqueued_collective": "1"},
                          "2": {"last_completed_collective": "-1",
                                "last_enqueued_collective": "-1"}},
            "entries": [entry(1, "all_reduce", False, pg=1)],
            "pg_config": {"1": {"ranks": "[0, 2]"}}}
    [group] = group_progress(dump, default_world=4)
    assert (group["pg"], group["ranks"], group["op"]) == ("1", [0, 2], "all_reduce")


def test_describe_tensors() -> None:
    assert describe_tensors(["Float", "BFloat16"], [[1024], [2, 3]]) == \
        "float32[1024], bfloat16[2, 3]"
    assert describe_tensors([], []) == ""


def block_here(ready: threading.Event, release: threading.Event) -> None:
    ready.set()
    release.wait()


def test_the_user_frame_of_another_threads_stack() -> None:
    ready, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=block_here, args=(ready, release), name="blocked")
    thread.start()
    try:
        assert ready.wait(30)
        frames = sys._current_frames()
        assert thread.ident is not None
        stack = frames_of(frames[thread.ident])
        stdlib = threading.__file__.rsplit("/", 1)[0] + "/"
        frame = user_frame(stack, (stdlib,))
        assert frame is not None and site_of(frame, with_function=True).startswith(
            "block_here (test_progress.py:")
        threads = thread_stacks(frames, {thread.ident: "blocked"},
                                skip_ident=threading.get_ident())
        assert "blocked" in [t["name"] for t in threads]
        assert threading.get_ident() not in [t["ident"] for t in threads]
    finally:
        release.set()
        thread.join()


def test_resolve_hang() -> None:
    assert resolve_hang() == HangSettings(60.0, None, 5.0)
    assert resolve_hang("2", "10") == HangSettings(2.0, 10.0, 0.5)
    assert resolve_hang(None, None, {"UNIRANK_HANG_REPORT_AFTER": "off"}).report_after is None
    assert resolve_hang("0", "30").timeout is None  # no detector: nothing to time out
    # a timeout below the report delay: the hang is seen (and reported) by then
    assert resolve_hang(None, "15") == HangSettings(15.0, 15.0, 1.875)
    assert resolve_hang(None, None, {"UNIRANK_HANG_REPORT_AFTER": "8",
                                     "UNIRANK_HANG_INTERVAL": "1"}).interval == 1.0
    settings = HangSettings(2.0, 10.0, 0.5)
    assert resolve_hang(None, None, settings.environ()) == settings
    with pytest.raises(ConfigError, match="--hang-timeout='soon'"):
        resolve_hang(None, "soon")
    with pytest.raises(ConfigError, match="UNIRANK_HANG_REPORT_AFTER='-1'"):
        resolve_hang(None, None, {"UNIRANK_HANG_REPORT_AFTER": "-1"})


def test_waits_for_a_dataloader_worker_only_below_the_users_frame() -> None:
    from unirank.hang.progress import waits_for

    user = ("/work/train.py", 20, "<module>", "batch = next(it)")
    loader = "/py/site-packages/torch/utils/data/dataloader.py"
    waiting = [("/work/train.py", 1, "<module>", ""), user,
               (loader, 733, "__next__", ""), (loader, 1480, "_next_data", ""),
               ("/py/lib/queue.py", 180, "get", "")]
    assert waits_for(waiting, user) == "a DataLoader worker"
    # num_workers=0: the user's __getitem__ is the innermost user frame; nothing below it
    getitem = ("/work/data.py", 9, "__getitem__", "lock.acquire()")
    assert waits_for([user, (loader, 733, "__next__", ""), getitem], getitem) == ""
    assert waits_for(waiting, None) == ""


def test_installed_libraries_are_not_the_users_code(tmp_path: Path) -> None:
    """Issue 34: a library on PYTHONPATH (tqdm's std.py) was named as the script's line."""
    from unirank.hang.progress import installed_folders

    libs, project = tmp_path / "libs", tmp_path / "project"
    (libs / "tqdm-4.67.1.dist-info").mkdir(parents=True)
    project.mkdir()
    assert installed_folders([str(libs), str(project), ""], str(project)) == (str(libs),)
    assert installed_folders([str(libs)], str(libs)) == ()  # the script's own folder
    stack = [("/work/train.py", 53, "<module>", ""),
             ("/venv/lib/python3.11/site-packages/tqdm/std.py", 1175, "__iter__", ""),
             (f"{libs}/tqdm/std.py", 1175, "__iter__", "")]
    assert user_frame(stack, (f"{libs}/",)) == stack[0]
