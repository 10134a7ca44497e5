"""When a rendezvous round closes and who is in it (:mod:`unirank.supervisor.rdzv.rounds`):
pure, milliseconds."""

from __future__ import annotations

from unirank.supervisor.rdzv.rounds import Pending, has_quorum, members_of, round_closes

SETTINGS = {"min_nodes": 1, "max_nodes": 3, "last_call": 3.0, "close_timeout": 30.0}


def _pending(before: str, alive: str, waiting: str, open_for: float = 0.0,
             min_for: float = 0.0, dead: str = "") -> Pending:
    return Pending(before=tuple(before), alive=frozenset(alive), waiting=tuple(waiting),
                   open_for=open_for, min_for=min_for, dead=frozenset(dead))


def test_the_first_round_waits_the_last_call_unless_max_nodes_came() -> None:
    assert not round_closes(_pending("", "ab", "ab", 1, 1), **SETTINGS)
    assert round_closes(_pending("", "ab", "ab", 3, 3), **SETTINGS)
    assert round_closes(_pending("", "abc", "abc"), **SETTINGS)
    assert not round_closes(_pending("", "a", "a", 99, 99), **{**SETTINGS, "min_nodes": 2})


def test_after_a_loss_the_round_closes_once_every_survivor_rejoined() -> None:
    # b was lost (not alive): a and c rejoined, nothing else can come: no last call
    assert round_closes(_pending("abc", "ac", "ac"), **SETTINGS)
    # c is alive but has not rejoined yet: wait for it, up to the close timeout (b dead:
    # a alone is half of a and c, and the first of them)
    assert not round_closes(_pending("abc", "ac", "a", 29, 29, dead="b"), **SETTINGS)
    assert round_closes(_pending("abc", "ac", "a", 30, 30, dead="b"), **SETTINGS)
    # b only silent: a alone is no quorum of three, whatever the wait
    assert not round_closes(_pending("abc", "ac", "a", 99, 99), **SETTINGS)


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


def test_the_serving_node_comes_first_so_a_tie_falls_to_it() -> None:
    """In a two-node job whose other node joined first, the serving node still wins a tie."""
    first = members_of((), ("b", "a"), frozenset("ab"), 2, serving="a")
    assert first == ("a", "b")
    assert has_quorum(first, {"a"}, ()) and not has_quorum(first, {"b"}, ())
    assert members_of(("c", "a", "b"), ("a", "b", "c"), frozenset("abc"), 2, serving="b") == \
        ("b", "c")
    assert members_of(("a", "b"), ("a", "b"), frozenset("ab"), 5, serving="x") == ("a", "b")


def test_the_successor_is_the_first_member_not_known_lost() -> None:
    from unirank.supervisor.rdzv.rounds import successor

    assert successor(("a", "b", "c"), {"a"}) == "b"
    assert successor(("a", "b", "c"), {"a", "b"}) == "c"  # b unreachable too
    assert successor(("b", "a"), {"a"}) == "b"
    assert successor(("a",), {"a"}) is None


def test_newcomers_alone_never_close_a_round_while_the_job_runs() -> None:
    # a and b run (alive, neither asked for a round): c and d wait for the job's next round,
    # past the close timeout and even at MAX; no second world of newcomers
    assert not round_closes(_pending("ab", "abcd", "cd", 99, 99), **SETTINGS)
    assert not round_closes(_pending("ab", "abcd", "cd", 99, 99), **{**SETTINGS, "max_nodes": 2})
    # once a node of the job asks (or every node of the job is dead), the round forms
    assert round_closes(_pending("ab", "abc", "cab"), **SETTINGS)
    assert round_closes(_pending("ab", "c", "c", 3, 3, dead="ab"), **SETTINGS)
    # the job's nodes only silent (cut off, maybe training): the newcomer waits for them
    assert not round_closes(_pending("ab", "c", "c", 99, 99), **SETTINGS)


def test_a_fresh_server_of_the_job_follows_the_one_that_ran_on() -> None:
    from unirank.supervisor.rdzv.rounds import Served, follows

    fresh, running = Served("j", -1, "pod0'"), Served("j", 1, "pod1")
    assert follows(fresh, running)
    # one-way: the running job never follows the fresh one, nor a server itself
    assert not follows(running, fresh)
    assert not follows(running, Served("j", 5, "pod1"))
    # another job's server: no redirect
    assert not follows(Served("k", -1, "x"), running)
    # a fresh server that lost the race and closed a round alone (round 0) still follows
    assert follows(Served("j", 0, "pod0'"), running)
    # never a server proven dead, though named with a later round or an earlier place
    assert not follows(fresh, running, dead={"pod1"})
    assert not follows(Served("j", 1, "b", 1), Served("j", 1, "a", 0), dead={"a"})
    assert follows(Served("j", 1, "b", 1), Served("j", 1, "a", 0), dead={"x"})


def test_two_sides_of_a_split_without_a_quorum_meet_at_the_first_one_s_server() -> None:
    from unirank.supervisor.rdzv.rounds import Served, follows

    # three nodes cut off from each other, each serving round 3 alone (no quorum anywhere):
    # once healed, b and c follow a, and c follows b; never both ways
    a, b, c = Served("j", 3, "a", 0), Served("j", 3, "b", 1), Served("j", 3, "c", 2)
    assert follows(b, a) and follows(c, a) and follows(c, b)
    assert not follows(a, b) and not follows(a, c) and not follows(b, c)
    # two fresh servers (round -1) never follow each other by place
    assert not follows(Served("j", -1, "x", 1), Served("j", -1, "y", 0))


def test_two_servers_first_in_rounds_of_one_number_meet_at_the_name_that_sorts_first() -> None:
    """Issue 40's tie: each server counts itself first of its own round 1 (a frozen server
    that closed a round on stale joins, and the successor of the other side): without an
    order between them neither ever follows the other, and the job stays split."""
    from unirank.supervisor.rdzv.rounds import Served, follows

    x, pod1 = Served("j", 1, "x"), Served("j", 1, "pod1")
    assert follows(x, pod1) and not follows(pod1, x)
    # the order holds whichever asks, and the place still comes before the name
    assert follows(Served("j", 1, "a", 1), Served("j", 1, "b", 0))
    assert not follows(Served("j", 1, "b", 0), Served("j", 1, "a", 1))
    # and never towards a server proven dead
    assert not follows(x, pod1, dead={"pod1"})


def test_a_quorum_is_a_strict_majority_of_the_last_round_not_proven_dead() -> None:
    from unirank.supervisor.rdzv.rounds import has_quorum

    assert has_quorum(("a", "b", "c"), {"b", "c"}, ())
    assert not has_quorum(("a", "b", "c"), {"a"}, ())
    # a proven dead node is left out of the count: the survivors of a kill go on at once
    assert has_quorum(("a", "b", "c"), {"a"}, {"b", "c"})
    assert has_quorum(("a", "b"), {"b"}, {"a"})
    # five nodes cut three and two: only the three go on, whichever side serves
    assert has_quorum("abcde", set("cde"), ()) and not has_quorum("abcde", set("ab"), ())
    # the first round, and a round after every node of the last one died
    assert has_quorum((), (), ()) and has_quorum(("a",), (), {"a"})


def test_a_tie_goes_to_the_side_holding_the_first_node_of_the_round() -> None:
    from unirank.supervisor.rdzv.rounds import has_quorum

    # two nodes that lost each other, neither dead: the first goes on, the second waits
    assert has_quorum(("a", "b"), {"a"}, ()) and not has_quorum(("a", "b"), {"b"}, ())
    assert has_quorum("abcd", set("ad"), ()) and not has_quorum("abcd", set("bc"), ())
    # the first node dead: the tie-break passes to the first one not dead
    assert has_quorum("abcde", set("bc"), {"a"}) and not has_quorum("abcde", set("de"), {"a"})


def test_no_split_of_a_round_s_nodes_lets_both_sides_close_a_round() -> None:
    """Every split of one round's nodes into two sides that lost each other (nobody dead,
    or some proven dead on both sides' count): at most one side closes the next round."""
    from itertools import combinations

    for size in range(1, 7):
        nodes = "abcdef"[:size]
        for dead_count in range(size):
            for dead in combinations(nodes, dead_count):
                alive = [n for n in nodes if n not in dead]
                for k in range(len(alive) + 1):
                    for side in combinations(alive, k):
                        other = [n for n in alive if n not in side]
                        closes = [round_closes(_pending(nodes, "".join(group), "".join(group),
                                                        99, 99, dead="".join(dead)),
                                               **{**SETTINGS, "max_nodes": 6})
                                  for group in (side, other) if group]
                        assert sum(closes) <= 1, (nodes, dead, side)


def test_a_two_node_elastic_job_says_what_it_gives_up() -> None:
    from unirank.supervisor.rdzv.rounds import two_node_note

    assert "cannot tell a stalled or cut-off node serving the rendezvous from a lost one" in \
        str(two_node_note(1, 2))
    assert two_node_note(2, 2) is None and two_node_note(1, 3) is None


def test_a_server_at_an_earlier_round_is_behind_a_node() -> None:
    from unirank.supervisor.rdzv.rounds import behind

    assert behind(3, 4) and not behind(4, 4) and not behind(4, -1)
    assert not behind(3, None) and not behind(3, "4")  # an old node's hello says no round
