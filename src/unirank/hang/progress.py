"""One rank's progress, as data (pure): the collectives it entered and finished, per process
group, read from torch's flight recorder dump; the Python stacks of its threads; the frame of
a stack that is the user's own code.

A record (:func:`make_record`) is a small JSON-able dict that the rank's watcher sets in the
store once per interval::

    {"rank": 3, "node": "node1", "time": 1764.2, "where": "save (train.py:80)",
     "groups": [{"pg": "0", "ranks": null, "entered": 12, "done": 11, "op": "all_reduce",
                 "what": "float32[1024]", "since": 1760.1, "site": "train.py:57",
                 "calls": [[11, "all_reduce", "float32[1024]", "train.py:57"], ...]}]}

``entered``/``done`` are the group's last enqueued and last completed collective sequence
numbers; ``op``/``what``/``since`` describe the last one entered (``since``: when it was
entered, wall clock); ``site`` is the user's line that issued it, where known; ``calls``: the
group's last :data:`HISTORY` collectives (number, op, tensors, the user's line where the
watcher saw it waiting), oldest first, so that the detector can find the earliest
collective whose ops or shapes differ between ranks (present where the recorder's entries
were read). ``phase``: the phase the program is in (:mod:`unirank.hang.phases`; absent
outside one); ``cpu``: the process's CPU seconds but its watcher's, set by the watcher as it
publishes (:mod:`unirank.hang.learned`).

Reads no environment variable.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import sys
import sysconfig
import threading
from collections.abc import Iterable, Mapping, Sequence
from types import FrameType
from typing import Any

__all__ = [
    "HISTORY",
    "Frame",
    "describe_tensors",
    "group_progress",
    "installed_folders",
    "make_record",
    "site_of",
    "thread_stacks",
    "user_frame",
    "waits_for",
]

#: a frame as (file, line, function, source line)
Frame = tuple[str, int, str, str]

#: how many of a group's last collectives a record lists (``calls``)
HISTORY = 16

_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
           "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8",
           "Bool": "bool", "ComplexFloat": "complex64", "ComplexDouble": "complex128"}


def describe_tensors(dtypes: Sequence[str], sizes: Sequence[Sequence[int]]) -> str:
    """``float32[1024]`` (several tensors: joined by ``, ``); ``""`` when nothing is known."""
    parts = []
    for dtype, shape in zip(dtypes, sizes):
        name = _DTYPES.get(str(dtype), str(dtype).lower())
        parts.append(f"{name}[{', '.join(str(n) for n in shape)}]")
    return ", ".join(parts)


def _op_name(profiling_name: str) -> str:
    """``gloo:all_reduce`` -> ``all_reduce``; ``nccl:all_gather_into_tensor_coalesced`` too."""
    return profiling_name.split(":", 1)[-1] or "collective"


def _members(config: Any) -> list[int] | None:
    """A group's ranks from the flight recorder's ``pg_config`` entry, None where unknown."""
    text = config.get("ranks") if isinstance(config, Mapping) else None
    try:
        return [int(r) for r in str(text).strip("[] ").split(",") if r.strip()] or None
    except ValueError:
        return None


def group_progress(dump: Mapping[str, Any], default_world: int) -> list[dict[str, Any]]:
    """Each process group's progress from a flight recorder dump (``_dump_fr_trace_json``):
    its last entered and finished collective, what the last entered one is, and its last
    :data:`HISTORY` collectives (``calls``; their sites are the watcher's to fill: the dump
    has no stacks). A group whose ranks are all ``default_world`` ranks gets
    ``ranks: None``."""
    entries = [e for e in dump.get("entries", ()) if isinstance(e, Mapping)]
    configs = dump.get("pg_config", {}) or {}
    groups = []
    for pg, status in sorted((dump.get("pg_status") or {}).items()):
        entered = int(status.get("last_enqueued_collective", -1))
        done = int(status.get("last_completed_collective", -1))
        if entered < 0:
            continue
        group: dict[str, Any] = {"pg": str(pg), "entered": entered, "done": done, "op": "",
                                 "what": "", "since": None, "thread": None}
        mine = [e for e in entries if str(e.get("pg_id")) == str(pg) and not e.get("is_p2p")]
        calls = []
        for entry in mine[-HISTORY:]:
            op = _op_name(str(entry.get("profiling_name", "")))
            what = describe_tensors(entry.get("input_dtypes", ()), entry.get("input_sizes", ()))
            calls.append([int(entry.get("collective_seq_id", -1)), op, what, ""])
            if entry.get("collective_seq_id") == entered:
                group.update(op=op, what=what, thread=entry.get("thread_id"),
                             since=int(entry.get("time_created_ns", 0)) / 1e9 or None)
        if calls:
            group["calls"] = calls
        members = _members(configs.get(str(pg)) or _by_name(configs, entries, pg))
        group["ranks"] = None if members is None or len(members) == default_world else members
        groups.append(group)
    return groups


def _by_name(configs: Mapping[str, Any], entries: Iterable[Mapping[str, Any]],
             pg: str) -> Any:
    """pg_config is keyed by group name; entries name their group as [id, name]."""
    for entry in entries:
        names = entry.get("process_group")
        if str(entry.get("pg_id")) == str(pg) and isinstance(names, list) and len(names) > 1:
            return configs.get(str(names[1])) or configs.get(str(names[0]))
    return None


#: folders where installers put libraries, wherever they are (a virtual environment's too)
_INSTALLED = ("site-packages", "dist-packages")


def _is_library(path: str, skip: Sequence[str]) -> bool:
    parts = path.replace(os.sep, "/").split("/")
    return (path.startswith("<") or any(path.startswith(prefix) for prefix in skip)
            or any(part in _INSTALLED for part in parts))


def installed_folders(path: Sequence[str], script_dir: str) -> tuple[str, ...]:
    """The folders of ``path`` (``sys.path``) that hold installed distributions (a
    ``*.dist-info`` or ``*.egg-info`` folder: ``pip install --target DIR`` put on
    PYTHONPATH), but the script's own folder ``script_dir`` and the working directory."""
    found = []
    own = {os.path.abspath(script_dir or "."), os.path.abspath(".")}
    for folder in path:
        folder = os.path.abspath(folder or ".")
        if folder in own or not os.path.isdir(folder):
            continue
        with contextlib.suppress(OSError):
            if any(name.endswith((".dist-info", ".egg-info")) for name in os.listdir(folder)):
                found.append(folder)
    return tuple(found)


def base_prefixes() -> tuple[str, ...]:
    """The standard library's folders, unirank's, and the folders of ``sys.path`` that hold
    installed distributions (:func:`installed_folders`) (``sysconfig`` may import its data
    module on a first call: call this where imports are allowed, not in the watcher's
    thread)."""
    main = sys.modules.get("__main__")
    script = str(getattr(main, "__file__", "") or "")
    return (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"],
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            *installed_folders(sys.path, os.path.dirname(os.path.abspath(script))
                               if script else ""))


def library_prefixes(base: Sequence[str] | None = None) -> tuple[str, ...]:
    """Folders whose frames are never the user's: ``base`` (default :func:`base_prefixes`),
    and torch's once it is imported. Imports nothing when ``base`` is given."""
    prefixes = set(base_prefixes() if base is None else base)
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):
        prefixes.add(os.path.dirname(os.path.abspath(str(torch.__file__))))
    return tuple(sorted(p.rstrip(os.sep) + os.sep for p in prefixes))


def user_frame(stack: Sequence[Frame], skip: Sequence[str]) -> Frame | None:
    """The innermost frame of ``stack`` (outermost first) outside the folders in ``skip``."""
    for frame in reversed(stack):
        if not _is_library(os.path.abspath(frame[0]) if not frame[0].startswith("<")
                           else frame[0], skip):
            return frame
    return None


#: library files whose frames, below the user's innermost one, say what a thread waits for
_WAITS_IN = (("torch/utils/data/dataloader.py", "a DataLoader worker"),)


def waits_for(stack: Sequence[Frame], user: Frame | None) -> str:
    """What the frames below ``user`` (the user's innermost frame of ``stack``) wait for:
    ``a DataLoader worker`` when the DataLoader's main-process side is there (a worker
    process's ``__getitem__`` is stuck, or slow); ``""`` when nothing is known."""
    below = stack[stack.index(user) + 1:] if user in stack else ()
    for path, _line, _function, _source in below:
        for marker, what in _WAITS_IN:
            if path.replace(os.sep, "/").endswith(marker):
                return what
    return ""


def site_of(frame: Frame | None, *, with_function: bool = False) -> str:
    """``train.py:57`` (``save (train.py:80)`` with the function); ``""`` for no frame."""
    if frame is None:
        return ""
    where = f"{os.path.basename(frame[0])}:{frame[1]}"
    return f"{frame[2]} ({where})" if with_function else where


def other_threads_frames() -> dict[int, FrameType]:
    """Every other thread's innermost frame: :func:`sys._current_frames` without the caller's
    own. With its own frame in it, the dict a caller keeps in a local makes a reference cycle
    (frame -> dict -> frame), and every frame it names, the program's with their locals (a
    process group, tensors), then lives until the cycle collector runs: a gloo group freed by
    the collector at the interpreter's exit aborts the process (torch 2.13: its worker thread
    cannot take the GIL then, "terminate called without an active exception")."""
    frames = sys._current_frames()
    frames.pop(threading.get_ident(), None)
    return frames


def frames_of(frame: FrameType | None) -> list[Frame]:
    """A live frame's stack, outermost first (source lines from linecache)."""
    stack: list[Frame] = []
    while frame is not None:
        code = frame.f_code
        line = frame.f_lineno or 0
        stack.append((code.co_filename, line, code.co_name,
                      linecache.getline(code.co_filename, line).strip()))
        frame = frame.f_back
    stack.reverse()
    return stack


def thread_stacks(frames: Mapping[int, FrameType], names: Mapping[int, str],
                  skip_ident: int | None = None) -> list[dict[str, Any]]:
    """Every thread's stack (from :func:`sys._current_frames`), named (``names``: ident ->
    thread name), the main thread first, without ``skip_ident`` (the watcher itself)."""
    threads = []
    for ident, frame in frames.items():
        if ident == skip_ident:
            continue
        threads.append({"name": names.get(ident, f"thread {ident}"), "ident": ident,
                        "frames": [list(f) for f in frames_of(frame)]})
    threads.sort(key=lambda t: (t["name"] != "MainThread", t["name"], t["ident"]))
    return threads


def trim_to_user(threads: list[dict[str, Any]], skip: Sequence[str]) -> list[dict[str, Any]]:
    """``threads`` with each stack cut before its outermost frame of the user's code (the
    interpreter's and the launcher's frames above it say nothing); a child process's
    (``child``) before its innermost one (above it: how the child was forked and started)."""
    for thread in threads:
        frames = thread["frames"]
        mine = [i for i, f in enumerate(frames) if user_frame([tuple(f)], skip) is not None]
        outer = (mine[-1] if thread.get("child") else mine[0]) if mine else None
        if outer:
            thread["frames"] = frames[outer:]
    return threads


def make_record(rank: int, node: str, now: float, groups: list[dict[str, Any]],
                where: str, *, finished: bool = False, recorder: bool = True,
                phase: str = "", group: int | None = None) -> dict[str, Any]:
    """This rank's record (see the module docstring); ``finished``: its program has ended;
    ``recorder``: the flight recorder could be read; ``phase``: the phase the program is in
    (:mod:`unirank.hang.phases`); ``group``: its node's rank (torchrun's GROUP_RANK), where
    known."""
    record: dict[str, Any] = {"rank": rank, "node": node, "time": now, "where": where,
                              "groups": [{k: v for k, v in g.items() if k != "thread"}
                                         for g in groups]}
    if group is not None:
        record["group"] = group
    if finished:
        record["finished"] = True
    if phase:
        record["phase"] = phase
    if not recorder:
        record["recorder"] = False
    return record
