"""Why a worker died, read from files: :mod:`unirank.supervisor.deathcause` over fake cgroup
trees, kernel logs and faulthandler dumps (pure; the real OOM, SIGSEGV and SIGABRT are in
test_why_died.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from unirank.supervisor.deathcause import (
    MemoryCgroup,
    fault_stack,
    kernel_log_lines,
    memory_cgroup,
    oom_killed_pids,
    oom_verdict,
    read_fault_file,
)

MOUNTS_V2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
MOUNTS_V1 = ("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n"
             "34 31 0:31 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n"
             "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
             "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n")
#: a container's view: its cgroup namespace's root is /job1 of the host's hierarchy
MOUNTS_V2_NESTED = "30 23 0:26 /job1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"

V2_EVENTS = "low 0\nhigh 0\nmax 12\noom 1\noom_kill {n}\noom_group_kill 0\n"
V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n"


def files(tree: dict[str, str]) -> Callable[[str], str]:
    """A read_text over ``tree`` (path -> text); any other path is missing."""
    def read_text(path: str) -> str:
        if path not in tree:
            raise FileNotFoundError(path)
        return tree[path]
    return read_text


def test_a_v2_cgroup_is_found_with_its_count() -> None:
    tree = {"/proc/7/cgroup": "0::/job1/step0/task_1\n", "/proc/self/mountinfo": MOUNTS_V2,
            "/sys/fs/cgroup/job1/step0/task_1/memory.events": V2_EVENTS.format(n=2)}
    assert memory_cgroup(7, read_text=files(tree)) == MemoryCgroup(
        "/sys/fs/cgroup/job1/step0/task_1", 2, "/sys/fs/cgroup", 2)


def test_a_v2_path_under_a_namespace_s_root_is_joined_once() -> None:
    tree = {"/proc/7/cgroup": "0::/job1/task_1\n", "/proc/self/mountinfo": MOUNTS_V2_NESTED,
            "/sys/fs/cgroup/task_1/memory.events": V2_EVENTS.format(n=0)}
    found = memory_cgroup(7, read_text=files(tree))
    assert found is not None and found.path == "/sys/fs/cgroup/task_1"


def test_a_hybrid_host_uses_the_v1_memory_hierarchy() -> None:
    """cgroup v2 mounted too, but without memory.events: the v1 memory controller counts."""
    tree = {"/proc/7/cgroup": "9:cpuset:/\n4:memory:/box/a\n0::/\n",
            "/proc/self/mountinfo": MOUNTS_V1,
            "/sys/fs/cgroup/memory/box/a/memory.oom_control": V1_OOM_CONTROL.format(n=3)}
    assert memory_cgroup(7, read_text=files(tree)) == MemoryCgroup(
        "/sys/fs/cgroup/memory/box/a", 1, "/sys/fs/cgroup/memory", 3)


def test_no_count_anywhere_is_no_cgroup() -> None:
    tree = {"/proc/7/cgroup": "0::/\n", "/proc/self/mountinfo": MOUNTS_V2}
    assert memory_cgroup(7, read_text=files(tree)) is None
    assert memory_cgroup(7, read_text=files({})) is None  # the worker is gone already


def test_a_count_that_rose_is_the_oom_killer_with_the_smallest_limit_above() -> None:
    cgroup = MemoryCgroup("/sys/fs/cgroup/job1/task_1", 2, "/sys/fs/cgroup", 0)
    tree = {"/sys/fs/cgroup/job1/task_1/memory.events": V2_EVENTS.format(n=1),
            "/sys/fs/cgroup/job1/task_1/memory.max": "max\n",
            "/sys/fs/cgroup/job1/memory.max": "209715200\n",
            "/sys/fs/cgroup/memory.max": "1073741824\n"}
    verdict = oom_verdict(7, cgroup, read_text=files(tree), kernel_log=lambda since: None)
    assert verdict is not None and verdict.killed
    assert (verdict.limit_cgroup, verdict.limit_file, verdict.limit) == (
        "/sys/fs/cgroup/job1", "memory.max", 200 << 20)


def test_a_count_that_did_not_rise_is_not_the_oom_killer() -> None:
    cgroup = MemoryCgroup("/sys/fs/cgroup/memory/a", 1, "/sys/fs/cgroup/memory", 4)
    tree = {"/sys/fs/cgroup/memory/a/memory.oom_control": V1_OOM_CONTROL.format(n=4),
            "/sys/fs/cgroup/memory/a/memory.limit_in_bytes": "9223372036854771712\n"}

    def log(since: float) -> list[str]:
        raise AssertionError("the kernel log is read only without a count")

    verdict = oom_verdict(7, cgroup, read_text=files(tree), kernel_log=log)
    assert verdict is not None and not verdict.killed and verdict.limit is None
    assert verdict.evidence == "its cgroup's memory.oom_control"


KMSG = ["Memory cgroup out of memory: Killed process 4242 (python3) total-vm:119028kB, "
        "anon-rss:102016kB", "oom_reaper: reaped process 4242 (python3)",
        "Out of memory: Killed process 17 (java) total-vm:1kB"]


def test_without_a_count_the_kernel_log_decides() -> None:
    assert oom_killed_pids(KMSG) == {4242, 17}
    killed = oom_verdict(4242, None, read_text=files({}), kernel_log=lambda since: KMSG)
    assert killed is not None and killed.killed and killed.evidence == "the kernel log"
    other = oom_verdict(99, None, read_text=files({}), kernel_log=lambda since: KMSG)
    assert other is not None and not other.killed
    assert oom_verdict(99, None, read_text=files({}), kernel_log=lambda since: None) is None


def test_an_unreadable_kernel_log_is_none(tmp_path: Path) -> None:
    assert kernel_log_lines(path=str(tmp_path / "no-kmsg")) is None


def test_the_kernel_log_is_read_from_the_worker_s_start(tmp_path: Path) -> None:
    """Records before ``since`` (microseconds since boot, the third field) are left out: a pid
    the OOM killer killed long ago may be a new worker's now. A plain file reads to its end."""
    log = tmp_path / "kmsg"
    log.write_text("3,1,5000000,-;Killed process 12 (old)\n")
    assert kernel_log_lines(since=6.0, path=str(log)) == []
    assert oom_killed_pids(kernel_log_lines(since=4.0, path=str(log)) or []) == {12}


DUMP = """Fatal Python error: Segmentation fault

Thread 0x00007f0000000700 (most recent call first):
  <no Python frame>

Current thread 0x00007fa6dfe72b80 (most recent call first):
  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at
  File "/tmp/job/train.py", line 6 in crash
  File "/tmp/job/train.py", line 10 in <module>
  File "/venv/lib/unirank/supervisor/worker/target.py", line 121 in _run_script
  File "/venv/lib/unirank/supervisor/fork/server.py", line 261 in <module>
  File "<frozen runpy>", line 88 in _run_code

Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)
"""


def test_a_fault_s_stack_keeps_the_user_s_frames() -> None:
    assert fault_stack("older\n" + DUMP.replace("Segmentation", "Bus") + "\n" + DUMP) == [
        "Fatal Python error: Segmentation fault",
        "Current thread 0x00007fa6dfe72b80 (most recent call first):",
        '  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at',
        '  File "/tmp/job/train.py", line 6 in crash',
        '  File "/tmp/job/train.py", line 10 in <module>',
    ]
    assert fault_stack("no dump here") == []
    assert fault_stack(DUMP, max_lines=3)[-1] == "  ..."


def test_a_missing_fault_file_is_no_stack(tmp_path: Path) -> None:
    assert read_fault_file(str(tmp_path / "fault.txt")) == []
    assert read_fault_file(None) == []


def test_fault_stack_leaves_out_the_hang_watcher_thread() -> None:
    dump = """Fatal Python error: Segmentation fault

Thread 0x00007fa3216146c0 (most recent call first):
  File "/usr/lib/python3.11/sysconfig.py", line 616 in get_paths
  File "/site/unirank/hang/watcher.py", line 251 in record
  File "/usr/lib/python3.11/threading.py", line 982 in run

Thread 0x00007fa3216146c1 (most recent call first):
  File "/work/loader.py", line 3 in fetch

Current thread 0x00007fa3411bbb80 (most recent call first):
  File "/work/segv.py", line 6 in crash
"""
    assert fault_stack(dump) == [
        "Fatal Python error: Segmentation fault",
        "Thread 0x00007fa3216146c1 (most recent call first):",
        '  File "/work/loader.py", line 3 in fetch',
        "Current thread 0x00007fa3411bbb80 (most recent call first):",
        '  File "/work/segv.py", line 6 in crash',
    ]
