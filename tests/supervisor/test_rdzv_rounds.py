"""When a rendezvous round closes and who is in it (:mod:`unirank.supervisor.rdzv.rounds`):
pure, milliseconds."""

from __future__ import annotations

from unirank.supervisor.rdzv.rounds import Pending, members_of, round_closes

SETTINGS = {"min_nodes": 1, "max_nodes": 3, "last_call": 3.0, "close_timeout": 30.0}


def _pending(before: str, alive: str, waiting: str, open_for: float = 0.0,
             min_for: float = 0.0) -> Pending:
    return Pending(before=tuple(before), alive=frozenset(alive), waiting=tuple(waiting),
                   open_for=open_for, min_for=min_for)


def test_the_first_round_waits_the_last_call_unless_max_nodes_came() -> None:
    assert not round_closes(_pending("", "ab", "ab", 1, 1), **SETTINGS)
    assert round_closes(_pending("", "ab", "ab", 3, 3), **SETTINGS)
    assert round_closes(_pending("", "abc", "abc"), **SETTINGS)
    assert not round_closes(_pending("", "a", "a", 99, 99), **{**SETTINGS, "min_nodes": 2})


def test_after_a_loss_the_round_closes_once_every_survivor_rejoined() -> None:
    # b was lost (not alive): a and c rejoined, nothing else can come: no last call
    assert round_closes(_pending("abc", "ac", "ac"), **SETTINGS)
    # c is alive but has not rejoined yet: wait for it, up to the close timeout
    assert not round_closes(_pending("abc", "ac", "a", 29, 29), **SETTINGS)
    assert round_closes(_pending("abc", "ac", "a", 30, 30), **SETTINGS)


def test_a_new_node_waiting_brings_the_last_call_back() -> None:
    assert not round_closes(_pending("ab", "abd", "abd"[:3], 1, 1),
                            **{**SETTINGS, "max_nodes": 4})
    assert round_closes(_pending("ab", "abd", "abd", 3, 3), **{**SETTINGS, "max_nodes": 4})
    # the replaced node makes the world MAX again: at once
    assert round_closes(_pending("ab", "abd", "abd"), **SETTINGS)


def test_a_lost_node_waiting_does_not_count() -> None:
    assert not round_closes(_pending("ab", "a", "ab"), **{**SETTINGS, "min_nodes": 2})
    assert round_closes(_pending("ab", "a", "ab"), **SETTINGS)


def test_members_keep_their_order_then_newcomers_up_to_max() -> None:
    assert members_of(("c", "a", "b"), ("a", "x", "c", "y"), frozenset("acxy"), 3) == \
        ("c", "a", "x")
    assert members_of((), ("b", "a"), frozenset("ab"), 5) == ("b", "a")
    assert members_of(("a", "b"), ("b", "a"), frozenset("a"), 5) == ("a",)


def test_the_successor_is_the_first_member_not_known_lost() -> None:
    from unirank.supervisor.rdzv.rounds import successor

    assert successor(("a", "b", "c"), {"a"}) == "b"
    assert successor(("a", "b", "c"), {"a", "b"}) == "c"  # b unreachable too
    assert successor(("b", "a"), {"a"}) == "b"
    assert successor(("a",), {"a"}) is None
    # every survivor computes the same answer from the same list: no split brain
    assert {successor(("a", "b", "c"), {"a"}) for _ in ("b", "c")} == {"b"}


def test_newcomers_alone_never_close_a_round_while_the_job_runs() -> None:
    # a and b run (alive, neither asked for a round): c and d wait for the job's next round,
    # past the close timeout and even at MAX; no second world of newcomers
    assert not round_closes(_pending("ab", "abcd", "cd", 99, 99), **SETTINGS)
    assert not round_closes(_pending("ab", "abcd", "cd", 99, 99), **{**SETTINGS, "max_nodes": 2})
    # once a node of the job asks (or every node of the job is lost), the round forms
    assert round_closes(_pending("ab", "abc", "cab"), **SETTINGS)
    assert round_closes(_pending("ab", "c", "c", 3, 3), **SETTINGS)


def test_a_fresh_server_of_the_job_follows_the_one_that_ran_on() -> None:
    from unirank.supervisor.rdzv.rounds import Served, follows

    fresh, running = Served("j", -1, "pod0'"), Served("j", 1, "pod1")
    assert follows(fresh, running)
    # one-way: the running job never follows the fresh one, nor a server itself
    assert not follows(running, fresh)
    assert not follows(running, Served("j", 5, "pod1"))
    # another job's server, an equal round: no redirect
    assert not follows(Served("k", -1, "x"), running)
    assert not follows(Served("j", 1, "x"), running)
    # a fresh server that lost the race and closed a round alone (round 0) still follows
    assert follows(Served("j", 0, "pod0'"), running)
