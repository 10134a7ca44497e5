"""The job's rendezvous secret: where it comes from (pure but for its file) and what a server
with one refuses (a real server thread on a loopback socket, connections driven by hand)."""

from __future__ import annotations

import os
import re
import selectors
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from _rdzv_wire import SPEC as WIRE_SPEC
from _rdzv_wire import serve_round_zero, until
from unirank.errors import ConfigError
from unirank.supervisor.listen import open_store_socket
from unirank.supervisor.rdzv.messages import hello_tag, place_tag
from unirank.supervisor.rdzv.secret import secret_of
from unirank.supervisor.rdzv.server import Server
from unirank.supervisor.rdzv.wire import Lines

SECRET = "s3cr3t-of-the-job"
SPEC = replace(WIRE_SPEC, secret=SECRET)


def _file(tmp_path: Path, text: str, mode: int) -> str:
    path = tmp_path / "secret"
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def test_the_secret_comes_from_the_variable_or_an_owner_only_file(tmp_path: Path) -> None:
    assert secret_of({}) == ""
    assert secret_of({"UNIRANK_RDZV_SECRET": " abc\n"}) == "abc"
    path = _file(tmp_path, "from-a-file\n", 0o600)
    assert secret_of({"UNIRANK_RDZV_SECRET_FILE": path}) == "from-a-file"
    os.chmod(path, 0o440)  # a pod's fsGroup may read it
    link = tmp_path / "link"  # Kubernetes mounts a Secret's key as a link
    link.symlink_to(path)
    assert secret_of({"UNIRANK_RDZV_SECRET_FILE": str(link)}) == "from-a-file"


@pytest.mark.parametrize(("text", "mode", "why"), [
    ("x", 0o644, "can be read by other users (mode 644) HINT: chmod 600"),
    ("  \n", 0o600, "holds no secret"),
])
def test_a_bad_secret_file_is_one_line(tmp_path: Path, text: str, mode: int, why: str) -> None:
    path = _file(tmp_path, text, mode)
    with pytest.raises(ConfigError, match=re.escape(why)):
        secret_of({"UNIRANK_RDZV_SECRET_FILE": path})


def test_a_missing_file_or_both_set_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot be read \(No such file"):
        secret_of({"UNIRANK_RDZV_SECRET_FILE": str(tmp_path / "none")})
    path = _file(tmp_path, "x", 0o600)
    with pytest.raises(ConfigError, match="and UNIRANK_RDZV_SECRET are both set"):
        secret_of({"UNIRANK_RDZV_SECRET_FILE": path, "UNIRANK_RDZV_SECRET": "y"})
    assert SECRET not in repr(SPEC)  # never shown


@pytest.fixture
def port() -> int:
    """A server of a job with a secret that ran round 0 with nodes a and b."""
    return serve_round_zero(SPEC)


def _hello(port: int, **extra: Any) -> Lines:
    lines = Lines(socket.create_connection(("127.0.0.1", port), timeout=30))
    lines.send({"op": "hello", "job": "none", "node": "b", "name": "b", "pid": 2, "round": 0,
                "nonce": "n1", **extra})
    return lines


def test_a_hello_without_the_secret_is_refused_and_with_it_answered_in_kind(port: int) -> None:
    assert until(_hello(port), "error")["error"] == \
        f"this node has no rendezvous secret (UNIRANK_RDZV_SECRET) and the rendezvous 'none' " \
        f"at 127.0.0.1:{port} has one"
    assert "this node's rendezvous secret (UNIRANK_RDZV_SECRET) is not the one of" in \
        until(_hello(port, auth="0" * 64), "error")["error"]
    good = _hello(port, auth=hello_tag(SPEC, "hello", "b", "n1"))
    answer = until(good, "ok")
    assert answer["auth"] == hello_tag(SPEC, "ok", "b", "n1")  # the server holds it too
    assert SECRET not in str(answer)
    good.close()


def test_a_job_without_a_secret_refuses_a_node_with_one() -> None:
    listening = open_store_socket(0)
    spec = replace(SPEC, endpoint_port=int(listening.getsockname()[1]), secret="")
    Server([listening], spec, "a").start()
    answer = until(_hello(spec.endpoint_port, auth="ab"), "error")
    assert "this node has a rendezvous secret (UNIRANK_RDZV_SECRET) and" in answer["error"]


def test_a_probe_without_the_secret_gets_no_answer_and_moves_nothing(port: int) -> None:
    node = _hello(port, auth=hello_tag(SPEC, "hello", "b", "n1"))
    until(node, "ok")
    there = {"job": "none", "round": 9, "server": "b", "place": 0, "addr": "127.0.0.1",
             "port": 9, "name": "b"}
    probe = Lines(socket.create_connection(("127.0.0.1", port), timeout=30))
    probe.send({"op": "redirect", **there, "auth": "0" * 64})
    with selectors.DefaultSelector() as selector:
        selector.register(probe.sock, selectors.EVENT_READ)
        assert selector.select(30) and probe.receive() is None  # closed, no answer
    signed = Lines(socket.create_connection(("127.0.0.1", port), timeout=30))
    signed.send({"op": "redirect", **there, "auth": place_tag(SPEC, "redirect", there)})
    answer = until(signed, "here")
    assert answer["auth"] == place_tag(SPEC, "here", answer["here"])
    assert until(node, "moved")["moved"]["port"] == 9  # the job's own successor is followed
    for lines in (node, signed):
        lines.close()
    assert os.environ.get("UNIRANK_RDZV_SECRET") is None


def test_the_docs_show_the_refusal_as_the_code_words_it() -> None:
    from unirank.supervisor.rdzv.messages import wrong_secret

    docs = " ".join((Path(__file__).parents[2] / "docs" / "run.md").read_text().split())
    spec = replace(SPEC, endpoint_host="node1", endpoint_port=29400, run_id="job7")
    assert f"(`{wrong_secret(spec, False)['error']}`)" in docs
