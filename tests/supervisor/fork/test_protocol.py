"""The fork server's wire format (:mod:`unirank.supervisor.fork.protocol`): each message reads
back as it was written, and the three sides depend on it instead of on each other (the child
and the client import no other side; only the server imports the child).

Environment variables read: none.
"""

from __future__ import annotations

import ast
from pathlib import Path

from unirank.supervisor.fork import protocol

FORK = Path(protocol.__file__).parent


def _roundtrip(message: protocol.Message) -> protocol.Message:
    packet = protocol.encode(message)
    assert len(packet) <= protocol.MAX_MESSAGE
    return protocol.decode(packet)


def test_a_spawn_message_becomes_the_child_s_request() -> None:
    message = _roundtrip(protocol.spawn_message(
        ("train.py", "--lr", "0.1"), {"RANK": "1"}, ["STALE"], [1, 2, 7], [2, 3]))
    request = protocol.request_of(message, [11, 12, 13], 5.5, (1.0, 2.0))
    assert request == protocol.Request(
        target=["train.py", "--lr", "0.1"], set_env={"RANK": "1"}, unset_env=["STALE"],
        fds=[11, 12, 13], targets=[1, 2, 7], forked_at=5.5, preloaded=(1.0, 2.0),
        ignored=(2, 3))


def test_the_server_s_answers_read_back() -> None:
    assert protocol.environ_of(_roundtrip(protocol.environ_message({"A": "1"}))) == {"A": "1"}
    assert protocol.ready_of(_roundtrip(protocol.ready_message((1.5, 2.5)))) == (1.5, 2.5)
    assert protocol.ready_of(_roundtrip(protocol.error_message("no torch"))) == "no torch"
    assert protocol.pid_of(_roundtrip(protocol.pid_message(42))) == 42
    assert protocol.pid_of(_roundtrip(protocol.refused_message("CUDA"))) == "CUDA"
    assert protocol.exit_of(_roundtrip(protocol.exit_message(42, -9))) == (42, -9, None)
    assert protocol.exit_of(_roundtrip(protocol.exit_message(42, -9, 2048))) == (42, -9, 2048)
    assert protocol.exit_of(_roundtrip(protocol.pid_message(42))) is None


def _fork_imports(module: str) -> set[str]:
    """The modules of the fork package that ``module`` imports (anywhere in it)."""
    tree = ast.parse((FORK / f"{module}.py").read_text(encoding="utf-8"))
    names = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    names |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
              for alias in node.names}
    prefix = "unirank.supervisor.fork."
    return {name[len(prefix):] for name in names if name.startswith(prefix)}


def test_the_sides_share_the_protocol_and_import_one_way() -> None:
    assert _fork_imports("child") == {"importtime", "protocol"}
    assert _fork_imports("client") == {"dispositions", "importtime", "protocol"}
    assert _fork_imports("server") == {"child", "dispositions", "protocol"}
    assert _fork_imports("protocol") == set()
    assert _fork_imports("dispositions") == set()
