"""What the fork server and its supervisor say to each other, and what a forked child gets.

The one home of the wire format: :mod:`.client` (in the ``unirank run`` parent), :mod:`.server`
(the server process) and :mod:`.child` (a forked child becoming its worker) all import this
module, and the client and the child import neither of the other two; only the server imports
the child (its forked child turns into the worker there). It imports nothing of unirank nor
torch, so that it runs in all three processes.

Every message is one JSON object in one packet of the ``SOCK_SEQPACKET`` socket, at most
:data:`MAX_MESSAGE` bytes. In order:

* supervisor to server: :func:`environ_message` once, first: the environment the workers of the
  node have in common, which the server takes before it imports; then a :func:`spawn_message`
  per worker (with the signals the supervisor ignores then), its descriptors passed with
  ``SCM_RIGHTS`` (at most :data:`MAX_FDS`);
* server to supervisor: :func:`ready_message` (with the import's start and end) or
  :func:`error_message`, once; a :func:`pid_message` or :func:`refused_message` per spawn; and
  an :func:`exit_message` per worker that ended, with its exit code as ``waitpid`` gives it
  (``os.waitstatus_to_exitcode``) and its peak resident memory (``ru_maxrss`` of ``wait4``,
  in KiB). Exits come whenever a worker ends, between the replies.

A forked child gets the spawn message as a :class:`Request` (:func:`request_of`).

Reads: no environment variable.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

__all__ = ["MAX_FDS", "MAX_MESSAGE", "Message", "Request", "decode", "encode",
           "environ_message", "environ_of", "error_message", "exit_message", "exit_of",
           "pid_message", "pid_of", "ready_message", "ready_of", "refused_message", "request_of",
           "spawn_message"]

#: the largest message (a worker's environment differences)
MAX_MESSAGE = 1 << 20
#: the most file descriptors one spawn passes
MAX_FDS = 16

#: one message, as JSON reads it
Message = dict[str, Any]


class Request(NamedTuple):
    """What a forked child needs to become its worker (see :mod:`.child`)."""

    #: the target: ``SCRIPT ARGS``, ``-m MODULE ARGS`` or ``--call FILE``
    target: list[str]
    #: the worker's environment, as differences from the server's
    set_env: dict[str, str]
    unset_env: list[str]
    #: the passed descriptors (as received) and the numbers the worker expects them at
    fds: list[int]
    targets: list[int]
    #: when the fork happened, and when the server's imports started and ended
    forked_at: float
    preloaded: tuple[float, float]
    #: the signals the supervisor ignored when it asked for the worker (see :mod:`.dispositions`)
    ignored: tuple[int, ...] = ()


def encode(message: Message) -> bytes:
    """One message as its packet."""
    return json.dumps(message).encode()


def decode(packet: bytes) -> Message:
    """One packet as its message."""
    message: Message = json.loads(packet)
    return message


# -- supervisor to server -------------------------------------------------------------------------

def environ_message(environ: Mapping[str, str]) -> Message:
    """The first message: the environment the server imports with."""
    return {"environ": dict(environ)}


def environ_of(message: Message) -> dict[str, str]:
    """The environment an :func:`environ_message` carries."""
    return dict(message["environ"])


def spawn_message(target: Sequence[str], set_env: Mapping[str, str],
                  unset_env: Sequence[str], numbers: Sequence[int],
                  ignored: Sequence[int] = ()) -> Message:
    """Fork one worker: its target, its environment as differences from the server's, the
    numbers its passed descriptors go to (in the order they are passed), and the signals the
    supervisor ignores (which the worker ignores too, as a child it exec'ed would)."""
    return {"target": list(target), "set": dict(set_env), "unset": list(unset_env),
            "fds": list(numbers), "ignored": [int(s) for s in ignored]}


def request_of(message: Message, fds: list[int], forked_at: float,
               preloaded: tuple[float, float]) -> Request:
    """The :class:`Request` a :func:`spawn_message` makes, with the descriptors that came with
    it, in the child forked for it."""
    return Request(
        target=list(message["target"]), set_env=dict(message["set"]),
        unset_env=list(message["unset"]), fds=fds, targets=list(message["fds"]),
        forked_at=forked_at, preloaded=preloaded,
        ignored=tuple(int(s) for s in message.get("ignored", ())),
    )


# -- server to supervisor -------------------------------------------------------------------------

def ready_message(preloaded: tuple[float, float]) -> Message:
    """The server imported (``preloaded``: when its imports started and ended)."""
    return {"ready": True, "preloaded": list(preloaded)}


def error_message(why: str) -> Message:
    """The server cannot serve, and ends."""
    return {"error": why}


def ready_of(message: Message) -> tuple[float, float] | str:
    """When the server's imports started and ended, or why it cannot serve."""
    if "error" in message:
        return str(message["error"])
    return (float(message["preloaded"][0]), float(message["preloaded"][1]))


def pid_message(pid: int) -> Message:
    """The worker forked for a spawn."""
    return {"pid": pid}


def refused_message(why: str) -> Message:
    """Why the server forked no worker for a spawn."""
    return {"refused": why}


def pid_of(message: Message) -> int | str:
    """The pid a spawn's reply names, or why the server refused."""
    if "pid" not in message:
        return str(message.get("refused", "the fork server refused"))
    return int(message["pid"])


def exit_message(pid: int, code: int, maxrss_kib: int | None = None) -> Message:
    """Worker ``pid`` ended with ``code`` (``os.waitstatus_to_exitcode``), its peak resident
    memory ``maxrss_kib`` KiB (``ru_maxrss``)."""
    return {"exit": pid, "code": code, "maxrss": maxrss_kib}


def exit_of(message: Message) -> tuple[int, int, int | None] | None:
    """The pid, exit code and peak memory (KiB, or None) an :func:`exit_message` carries;
    None for any other message."""
    if "exit" not in message:
        return None
    maxrss = message.get("maxrss")
    return int(message["exit"]), int(message["code"]), None if maxrss is None else int(maxrss)
