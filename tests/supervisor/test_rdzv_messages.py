"""The rendezvous's message check (:mod:`unirank.supervisor.rdzv.messages`): pure, in
milliseconds."""

from __future__ import annotations

import pytest

from unirank.supervisor.rdzv.messages import MAX_TEXT, BadMessage, parse_request

RECORD = {"addr": "10.0.0.1", "name": "n1", "nproc": 2, "store_port": 0,
          "serves_endpoint": False}


def test_good_messages_keep_their_fields_and_drop_others() -> None:
    hello = parse_request({"op": "hello", "job": "j", "node": "h:1:ab", "pid": 7, "round": 3,
                           "extra": [1]})
    assert hello.op == "hello" and hello.fields == {"job": "j", "node": "h:1:ab", "pid": 7,
                                                    "round": 3}
    join = parse_request({"op": "join", "record": {**RECORD, "junk": 1}})
    assert join.fields["record"] == RECORD
    assert parse_request({"op": "beat"}).fields == {}
    assert parse_request({"op": "evict", "nodes": ["a", "b"]}).get("why", "x") == "x"


@pytest.mark.parametrize(("message", "why"), [
    ([1, 2], "not a JSON object"),
    ({"op": "nope"}, "unknown op 'nope'"),
    ({"op": ["hello"]}, "unknown op"),
    ({"op": "hello", "job": "j"}, "hello: node missing"),
    ({"op": "hello", "job": "j", "node": "n", "pid": "12"}, "hello: pid is not a whole number"),
    ({"op": "hello", "job": "j", "node": "n", "pid": True}, "hello: pid is not a whole number"),
    ({"op": "hello", "job": "j", "node": "n" * (MAX_TEXT + 1)}, "hello: node is not a text"),
    ({"op": "join", "record": "x"}, "join: record is not an object"),
    ({"op": "join", "record": {**RECORD, "nproc": "2"}}, "join: record.nproc is not a whole"),
    # a node with no rank would stop every other node's plan ("every node runs at least one")
    ({"op": "join", "record": {**RECORD, "nproc": 0}}, "join: record.nproc 0 is not in 1.."),
    ({"op": "join", "record": {**RECORD, "store_port": 70000}},
     "join: record.store_port 70000 is not in 0..65535"),
    ({"op": "join", "record": {"addr": "a"}}, "join: record: name, nproc, store_port"),
    ({"op": "join", "record": {**RECORD, "serves_endpoint": 1}},
     "join: record.serves_endpoint is not true or false"),
    ({"op": "evict", "nodes": "a"}, "evict: nodes is not a list"),
    ({"op": "evict", "nodes": [1]}, "evict: nodes is not a text"),
    ({"op": "redirect", "job": "j", "round": "1", "server": "s"}, "redirect: round is not"),
])
def test_a_bad_message_names_what_is_wrong(message: object, why: str) -> None:
    with pytest.raises(BadMessage, match="^" + why.replace("(", r"\(")):
        parse_request(message)
