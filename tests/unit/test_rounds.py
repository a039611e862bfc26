"""Round decisions (pure): admission, rank order, last call, re-rendezvous, spares, close, holds, barrier."""

from __future__ import annotations

import base64
import json
import math
import random
import struct
import zlib

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from torch_mingle._frames import Join
from torch_mingle._quorum import may_accept
from torch_mingle._record import replace
from torch_mingle._records import History, Round, Status, WaitKind
from torch_mingle._rounds import Form, JoinRequest, RoundBook, Wait
from torch_mingle._settings import RoundRules
from torch_mingle._wire import deflated

LEADER = 0x10


def book(min_nodes=2, max_nodes=4, last_call=30.0, epoch=1, rejoin_delay=30.0):
    return RoundBook(
        leader=LEADER,
        epoch=epoch,
        rules=RoundRules(
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            last_call_timeout_s=last_call,
            rejoin_delay_s=rejoin_delay,
        ),
    )


def join(b: RoundBook, node: int, history: History | None = None) -> None:
    b.join(JoinRequest(node=node, join=Join(0, f"198.18.0.{node}"), history=history), 0.0)


def form(b: RoundBook, decision: Form | Wait, now: float = 0.0) -> Round:
    assert isinstance(decision, Form), decision
    rnd = Round(
        number=b.last_round_number + 1, epoch=b.epoch, members=decision.members, store_ip="x", store_port=1
    )
    b.formed(rnd, now)
    return rnd


def first_round(b: RoundBook, nodes: tuple[int, ...]) -> Round:
    """The first round of a job below max_nodes forms after the last call, as in c10d."""
    for node in nodes:
        join(b, node)
    b.decide(0.0)
    return form(b, b.decide(b.rules.last_call_timeout_s), b.rules.last_call_timeout_s)


def test_no_round_without_the_leader_even_at_max_nodes():
    b = book(min_nodes=2, max_nodes=2)
    join(b, 0x20)
    join(b, 0x30)
    assert isinstance(b.decide(0.0), Wait)
    join(b, LEADER)
    d = b.decide(0.0)
    assert isinstance(d, Form)
    assert d.members == (LEADER, 0x20)  # leader first, then arrival order; 0x30 is a spare
    assert d.ips == ("198.18.0.16", "198.18.0.32")


def test_max_nodes_forms_at_once_and_min_nodes_waits_for_the_last_call():
    b = book(min_nodes=2, max_nodes=4, last_call=30.0)
    join(b, LEADER)
    assert b.decide(0.0) == Wait(until=None, kind=WaitKind.TOO_FEW, reason="1 of min_nodes=2 nodes joined")
    join(b, 0x20)
    d = b.decide(1.0)
    assert isinstance(d, Wait)
    assert d.until == 31.0
    join(b, 0x30)
    assert isinstance(b.decide(20.0), Wait)
    d = b.decide(31.0)
    assert isinstance(d, Form)
    assert d.members == (LEADER, 0x20, 0x30)
    assert "last call" in d.reason


def test_a_re_rendezvous_forms_as_soon_as_everyone_is_back():
    b = book(min_nodes=2, max_nodes=4)
    rnd = first_round(b, (LEADER, 0x20, 0x30))
    assert rnd.members == (LEADER, 0x20, 0x30)
    # A worker failed: every agent re-joins; no last call when all known members are back.
    join(b, 0x30)
    join(b, LEADER)
    assert isinstance(b.decide(101.0), Wait)
    join(b, 0x20)
    d = b.decide(101.0)
    assert isinstance(d, Form)
    assert d.members == (LEADER, 0x20, 0x30)  # previous members keep their order
    assert "re-joined" in d.reason


def test_a_dead_member_makes_the_round_stale_and_is_not_waited_for():
    b = book(min_nodes=2, max_nodes=4)
    first_round(b, (LEADER, 0x20, 0x30))
    assert b.status(31.0).stale is False
    assert b.died(0x20, "no heartbeat") is False
    assert b.status(31.0).stale is True
    join(b, LEADER)
    join(b, 0x30)
    d = b.decide(32.0)
    assert isinstance(d, Form)
    assert d.members == (LEADER, 0x30)


def test_a_fixed_size_job_that_lost_a_node_names_it_while_it_waits():
    b = book(min_nodes=3, max_nodes=3)
    for node in (LEADER, 0x20, 0x30):
        join(b, node)
    form(b, b.decide(0.0))
    b.died(0x30, "no heartbeat for 3s")
    join(b, LEADER)
    join(b, 0x20)
    assert isinstance(b.decide(1.0), Wait)
    assert b.missing() == [0x30]
    assert not b.parked(0x20)  # its round is stale: it waits for a round, with a deadline
    explained = b.explain()
    assert "2 of min_nodes=3 nodes joined" in explained
    assert "0000000000000030 (198.18.0.48: no heartbeat for 3s)" in explained


def test_a_new_leader_recognizes_a_re_rendezvous_from_the_joiners_history():
    # Old leader 0x99 died; the survivors carry round 7 of epoch 3 to the new leader (epoch 4).
    hist = History(epoch=3, round=7, members=(0x99, 0x30, LEADER, 0x20))
    b = book(min_nodes=2, max_nodes=4, epoch=4)
    join(b, LEADER, hist)
    join(b, 0x20, hist)
    assert isinstance(b.decide(0.0), Wait)  # 0x30 was in that round and is expected back
    join(b, 0x30, hist)
    d = b.decide(0.0)
    assert isinstance(d, Form)
    assert d.members == (LEADER, 0x30, 0x20)  # survivors keep their relative order
    rnd = form(b, d)
    assert rnd.number == 8  # round numbers continue across terms


def test_spares_wait_beyond_max_nodes_and_replace_a_dead_node():
    b = book(min_nodes=2, max_nodes=3)
    for node in (LEADER, 0x20, 0x40, 0x30):
        join(b, node)
    form(b, b.decide(0.0))
    assert b.pending.keys() == {0x30}
    assert b.parked(0x30)
    assert b.status(0.0).waiting == 0  # the round is full: a spare does not trigger restarts
    b.died(0x20, "killed")
    assert not b.parked(0x30)
    assert b.status(0.0).waiting == 1
    join(b, LEADER)
    join(b, 0x40)  # with the leader, 2 of the 3 voters of the round (the dead one keeps its vote)
    d = b.decide(1.0)
    assert isinstance(d, Form)
    assert d.members == (LEADER, 0x30, 0x40)  # the spare takes the dead node's rank; 0x40 keeps its


def test_newcomers_count_as_waiting_while_there_is_room():
    b = book(min_nodes=2, max_nodes=3)
    first_round(b, (LEADER, 0x20))
    join(b, 0x30)
    join(b, 0x40)
    assert b.status(31.0).waiting == 1  # room for one more node


def test_a_returning_node_does_not_restart_a_fresh_round_until_it_ran_rejoin_delay():
    b = book(min_nodes=2, max_nodes=3, rejoin_delay=10.0)
    for node in (LEADER, 0x20, 0x30):
        join(b, node)
    form(b, b.decide(0.0), 0.0)
    b.died(0x30, "frozen")  # dropped: the others re-join without it
    join(b, LEADER)
    join(b, 0x20)
    form(b, b.decide(3.0), 3.0)
    # It wakes up and comes back 1.5 s later: the fresh round has not trained yet.
    join(b, 0x30, History(epoch=1, round=1, members=(LEADER, 0x20, 0x30)))
    assert b.parked(0x30)
    assert b.status(4.5).waiting == 0
    assert b.decide(4.5) == Wait(until=13.0, kind=WaitKind.LEADERS_JOIN, reason=b.decide(4.5).reason)
    assert b.status(13.0).waiting == 1  # the round ran rejoin_delay: now it may restart it
    # Dropped a second time: twice as long.
    join(b, LEADER)
    join(b, 0x20)
    form(b, b.decide(13.5), 13.5)
    b.died(0x30, "frozen again")
    join(b, LEADER)
    join(b, 0x20)
    form(b, b.decide(14.0), 14.0)
    join(b, 0x30)
    assert b.status(14.0 + 19.0).waiting == 0
    assert b.status(14.0 + 20.0).waiting == 1


ROUND_1 = History(epoch=1, round=1, members=(LEADER, 0x20, 0x40, 0x30))


def _dropped(rejoin_delay: float, formed_at: float) -> RoundBook:
    """Round 1 of four nodes; 0x30 was lost (frozen, killed), and round 2 formed at
    ``formed_at`` without it."""
    b: RoundBook = book(min_nodes=2, max_nodes=4, rejoin_delay=rejoin_delay)
    for node in (LEADER, 0x20, 0x40, 0x30):
        join(b, node)
    form(b, b.decide(0.0), 0.0)
    b.died(0x30, "lost")
    for node in (LEADER, 0x20, 0x40):
        join(b, node)
    form(b, b.decide(formed_at), formed_at)
    return b


def _returned_after_a_drop(rejoin_delay: float) -> RoundBook:
    """0x30 froze and was dropped, round 2 formed at 3 s without it, and 0x30 came back
    (joined again) while round 2 runs."""
    b = _dropped(rejoin_delay, 3.0)
    join(b, 0x30, ROUND_1)
    return b


def test_a_returning_node_joins_at_once_when_the_round_restarts_anyway():
    b = _returned_after_a_drop(rejoin_delay=10.0)
    b.died(0x20, "killed")  # the fresh round is stale anyway: no reason to hold anyone back
    assert b.status(4.0).waiting >= 1
    join(b, LEADER)
    join(b, 0x40)
    d = b.decide(4.0)
    assert isinstance(d, Form) and d.members == (LEADER, 0x30, 0x40)  # 0x40 keeps rank 2; 0x30 takes 1


def _restarted_join(b: RoundBook, node: int, history: History, now: float, incarnation: int) -> None:
    """A new process of ``node`` (a restarted agent) that was in no round yet asks to join."""
    req = JoinRequest(
        node=node, join=Join(0, f"198.18.0.{node}", restarted=True), history=history, incarnation=incarnation
    )
    b.join(req, now)


@pytest.mark.parametrize("rejoin_delay", [10.0, math.inf], ids=["10s", "never"])
def test_a_restarted_node_is_admitted_at_once_but_one_that_keeps_restarting_is_held(rejoin_delay):
    """Its predecessor's process is gone (killed, its container restarted): it comes back as a
    newcomer does, at the next restart, not after ``rejoin_delay`` as a node that flapped.
    Restarted again within ``rejoin_delay`` of its last restart, it keeps dying: held back."""
    hist = ROUND_1
    b = _dropped(rejoin_delay, 0.1)  # its process was killed
    _restarted_join(b, 0x30, hist, 2.0, incarnation=2)  # its agent restarted on its host, 2 s later
    _restarted_join(b, 0x30, hist, 2.05, incarnation=2)  # the same process again (a reconnect)
    assert b.status(2.0).waiting == 1  # the agents restart their workers for it now
    for node in (LEADER, 0x20, 0x40):
        join(b, node)
    d = b.decide(2.1)
    assert isinstance(d, Form) and set(d.members) == {LEADER, 0x20, 0x40, 0x30}
    form(b, d, 2.1)
    # Killed and restarted again, 5 s after its last restart: a node that keeps dying.
    b.died(0x30, "its process was killed again")
    for node in (LEADER, 0x20, 0x40):
        join(b, node)
    form(b, b.decide(7.0), 7.0)
    _restarted_join(b, 0x30, hist, 7.0, incarnation=3)
    assert b.parked(0x30) and b.status(7.0).waiting == 0
    if math.isfinite(rejoin_delay):
        assert b.status(7.0 + 2 * rejoin_delay).waiting == 1  # held as a node dropped twice


def test_a_node_that_comes_back_in_the_same_process_is_held_however_it_says_it_restarted():
    """Only a new process (``restarted``) is taken back at once; the same process returning
    (it froze, its link went down) is a node that flapped."""
    b = _returned_after_a_drop(rejoin_delay=10.0)
    assert b.parked(0x30) and b.status(4.0).waiting == 0


def test_with_rejoin_delay_never_a_returning_node_is_a_spare_until_the_round_breaks():
    """``rejoin_delay=never``: the returning node costs no restart; it waits, parked, and
    takes its place in the next round the job needs anyway (a member lost)."""
    b = _returned_after_a_drop(rejoin_delay=math.inf)
    for now in (4.0, 1e6):  # however long the round runs
        assert b.parked(0x30) and b.status(now).waiting == 0
        decision = b.decide(now)
        assert isinstance(decision, Wait) and decision.until is None  # no timer for it either
    b.died(0x40, "killed")
    assert b.status(1e6).waiting >= 1
    join(b, LEADER)
    join(b, 0x20)
    d = b.decide(1e6)
    assert isinstance(d, Form) and d.members == (LEADER, 0x20, 0x30)


def test_close_answers_every_waiting_join():
    b = book()
    join(b, LEADER)
    join(b, 0x20)
    assert sorted(b.close()) == [LEADER, 0x20]
    assert b.decide(0.0) == Wait(until=None, kind=WaitKind.CLOSED, reason="closed")
    assert b.status(0.0).closed
    assert b.status(0.0).waiting == 0


def test_all_gone_once_every_other_node_left_or_died():
    b = book(min_nodes=3, max_nodes=3)
    for node in (LEADER, 0x20, 0x30):
        join(b, node)
    form(b, b.decide(0.0))
    b.close()
    assert not b.all_gone()
    b.leave(0x20)
    assert not b.all_gone()
    b.died(0x30, "killed")
    assert b.all_gone()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(("join", "leave", "died", "form")), st.integers(1, 12)), max_size=60)
)
def test_all_gone_answers_as_a_pass_over_every_tracked_node_would(ops):
    """``all_gone`` walks a cursor (a pass per departure made a shutdown O(N**2)): whatever the
    joins, departures and rounds, its answer is the one a pass over ``tracked()`` gives."""
    b = book(min_nodes=1, max_nodes=16)
    join(b, LEADER)
    for op, n in ops:
        node = 0x100 + n
        if op == "join":
            join(b, node)
        elif op == "leave":
            b.leave(node)
        elif op == "died":
            b.died(node, "killed")
        elif LEADER in b.pending:
            decision = b.decide(1e6)
            if isinstance(decision, Form):
                form(b, decision, 1e6)
        assert b.all_gone() == (not (b.tracked() - {LEADER})), (op, n)
        assert b.check() == [], (op, n)


def test_departed_are_the_current_rounds_members_that_left_or_died_until_they_rejoin():
    b = book(min_nodes=2, max_nodes=3)
    for node in (LEADER, 0x20, 0x30):
        join(b, node)
    form(b, b.decide(0.0))
    join(b, 0x40)
    b.leave(0x40)  # not a member: its leaving holds nobody's exit barrier
    b.leave(0x20)
    b.died(0x30, "killed")
    assert b.departed() == {0x20, 0x30}
    join(b, 0x30)
    assert b.departed() == {0x20}
    join(b, LEADER)
    form(b, b.decide(0.0))  # a new round: nobody of it has left yet
    assert b.departed() == set()


def test_the_exit_barrier_opens_only_when_every_member_arrived_or_is_gone_for_good():
    b = book(min_nodes=3, max_nodes=3)
    for node in (LEADER, 0x20, 0x30):
        join(b, node)
    rnd = form(b, b.decide(0.0))
    b.arrive(LEADER, rnd.number)
    b.leave(0x20)  # its workers failed: it never arrives
    assert not b.barrier_to_open()  # 0x30 still trains
    b.arrive(0x30, rnd.number)
    assert b.barrier_to_open()


def test_a_member_that_arrived_and_died_is_not_counted_twice():
    b = book(min_nodes=3, max_nodes=3)
    for node in (LEADER, 0x20, 0x30):
        join(b, node)
    rnd = form(b, b.decide(0.0))
    b.arrive(LEADER, rnd.number)
    b.arrive(0x20, rnd.number)
    b.died(0x20, "killed in the barrier")
    assert not b.barrier_to_open()  # 0x30's workers still run
    b.arrive(0x30, rnd.number)
    assert not b.barrier_to_open()  # everyone arrived: torch's own count opens it


def test_round_status_and_history_round_trip_through_json():
    rnd = Round(number=3, epoch=2, members=(1, 2, 3), store_ip="fd00::1", store_port=4, ips=("a", "b", "c"))
    assert Round.from_json(rnd.to_json()) == rnd
    st = Status(epoch=1, round=2, size=3, joined=1, waiting=1, stale=False, closed=False, reason="x")
    assert Status.from_json(st.to_json()) == st
    hist = History(epoch=1, round=2, members=(5, 6))
    assert History.from_json(hist.to_json()) == hist


def _columns(n: int, d: int, p: int, numbers: bytes, ips: bytes = b"") -> str:
    """A round's ``columns`` field as a peer could make it: counts, numbers, addresses."""
    return deflated(struct.pack(">III", n, d, p) + numbers + ips)


@pytest.mark.parametrize(
    "bad",
    [
        ["0000000000000001"],  # a JSON list: the lists travel as one string
        "0000000000000001",  # hex: not base64 of zlib data
        "!!!!",  # not base64
        base64.b64encode(b"not zlib at all").decode(),
        deflated(b"\x00\x00"),  # shorter than the counts
        _columns(2, 0, 0, struct.pack(">Q", 1)),  # two ids said, one there
        _columns(1, 1, 0, struct.pack(">Q", 1)),  # a port said, none there
        _columns(2, 0, 0, struct.pack(">2Q", 1, 0)),  # node id 0
        _columns(65537, 0, 0, b""),  # more members than a round may have
        _columns(1, 0, 0, struct.pack(">Q", 1), b"1.2.3.4 " + b"9" * 65),  # an address longer than any
        _columns(1, 0, 0, struct.pack(">Q", 1), b"\xff\xfe"),  # addresses that are not text
        deflated(b"\x00" * (8 * 1024 * 1024)),  # 8 MiB once inflated, from a few KB
        base64.b64encode(zlib.compress(struct.pack(">III", 0, 0, 0))[:-2]).decode(),  # truncated
        base64.b64encode(zlib.compress(struct.pack(">III", 0, 0, 0)) + b"more").decode(),  # trailing
    ],
)
def test_a_round_whose_member_lists_are_not_what_a_leader_packs_is_refused(bad):
    rnd = Round(number=1, epoch=1, members=(1, 2), store_ip="10.0.0.1", store_port=4, ips=("a", "b"))
    with pytest.raises((ValueError, TypeError)):
        Round.from_json({**rnd.to_json(), "columns": bad})


def test_a_round_of_sixteen_thousand_members_is_one_compressed_string_a_third_of_its_hex():
    """Every member parses the round, and the leader sends it to every member (N x N entries):
    the lists are one string of packed ids and compressed addresses and ports, 11 bytes a
    member on one host instead of 34 as hex and text."""
    n = 16385
    rng = random.Random(n)
    rnd = Round(
        number=1, epoch=1, members=tuple(rng.getrandbits(63) | 1 for _ in range(n)), store_ip="10.0.0.1",
        store_port=4, ips=("127.0.0.1",) * n, dports=(29400,) * n, pports=(0,) * n,
    )  # fmt: skip
    data = json.loads(rnd.encoded)
    assert isinstance(data["columns"], str) and not {"members", "ips", "dports", "pports"} & data.keys()
    assert len(rnd.encoded) < 11 * n
    assert Round.from_json(data) == rnd


def test_a_round_of_a_job_across_racks_round_trips_and_stays_under_half_its_hex():
    n = 1024
    rnd = Round(
        number=1, epoch=1, members=tuple(range(1, n + 1)), store_ip="10.0.0.1", store_port=4,
        ips=tuple(f"10.0.{i // 250}.{i % 250}" for i in range(n)), dports=(29400,) * n,
        pports=tuple(32768 + (i * 7919) % 28000 for i in range(n)),
    )  # fmt: skip
    assert len(rnd.encoded) < 36 * n / 2
    assert Round.from_json(json.loads(rnd.encoded)) == rnd
    empty = Round(number=2, epoch=1, members=(), store_ip="fd00::1", store_port=4)
    assert Round.from_json(json.loads(empty.encoded)) == empty


# ------------------------------------------------- what the book keeps as joins come and go

_NODES = st.integers(min_value=LEADER, max_value=LEADER + 4)  # max_nodes=4: one spare
_HISTORIES = st.one_of(
    st.none(),
    st.builds(
        History,
        epoch=st.integers(0, 2),
        round=st.integers(0, 3),
        members=st.lists(_NODES, min_size=1, max_size=5, unique=True).map(tuple),
    ),
)
_OPS = st.lists(
    st.tuples(
        # joins and decisions most often (a round forms, its members re-join), a close rarely
        st.sampled_from(["join"] * 4 + ["decide"] * 3 + ["withdraw", "died", "leave", "close"]),
        _NODES,
        _HISTORIES,
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=_OPS)
@example(  # a member re-joins, then withdraws
    ops=[
        ("join", LEADER, None),
        ("join", LEADER + 1, None),
        ("decide", 0, None),
        ("join", LEADER + 1, None),
        ("withdraw", LEADER + 1, None),
    ]
)
def test_what_the_book_keeps_per_join_matches_a_count_from_scratch(ops):
    """A join costs the leader O(1) because the book keeps counts as joins come and go (the
    joiners in the running round, the newest history reported, the nodes a re-rendezvous
    waits for); any sequence of joins, withdrawals, deaths, rounds and a close leaves them
    equal to what a count over every joiner gives."""
    b = book(min_nodes=1, max_nodes=4, last_call=0.0)
    now = 0.0
    for op, node, hist in ops:
        now += 1.0
        if op == "join":
            b.join(JoinRequest(node=node, join=Join(0, "198.18.0.1"), history=hist), 0.0)
        elif op == "decide" or node == LEADER:  # the leader never withdraws, dies or leaves here
            decision = b.decide(now)
            if isinstance(decision, Form):
                form(b, decision, now)
        elif op == "withdraw":
            b.withdraw(node)
        elif op == "died":
            b.died(node, "test")
        elif op == "leave":
            b.leave(node)
        else:
            b.close()
        assert b.check() == [], (op, node)
        members = b.current.member_set if b.current else frozenset()
        assert b._rejoined == len(b.pending.keys() & members)
        histories = [r.history for r in b.pending.values() if r.history is not None]
        newest = max(histories, key=lambda h: (h.round, h.epoch), default=None)
        latest = b._latest_history()
        got = (latest.round, latest.epoch) if latest else None
        assert got == ((newest.round, newest.epoch) if newest else None)
        current = History.of(b.current) if b.current else None
        source = latest if latest is not None and latest.newer_than(current) else current
        assert b.base() == source
        if source is not None:
            base = set(source.members)
            if source.epoch != b.epoch and source.members[0] != b.leader:
                base.discard(source.members[0])
        else:
            assert not b._expected_joined()  # the first round waits for the last call
            continue
        if b.leader in b.pending:
            assert b._expected_joined() == (
                (base - b.ledger.lost - b.ledger.left) | {b.leader} <= b.pending.keys()
            )


def test_with_first_round_majority_no_side_of_a_split_below_half_of_max_nodes_starts_a_job():
    b = book(min_nodes=1, max_nodes=5, last_call=1.0)
    b.rules = replace(b.rules, first_round_majority=True)
    join(b, LEADER)
    join(b, 0x20)
    assert isinstance(b.decide(0.0), Wait)
    assert isinstance(b.decide(10.0), Wait)  # the last call changes nothing: 2 of 5 is no majority
    join(b, 0x30)
    b.decide(10.0)
    d = b.decide(11.0)
    assert isinstance(d, Form) and len(d.members) == 3


A, D, X = 0xA, 0xD, 0x7


@pytest.mark.parametrize(
    ("history", "accepted", "proposal", "base", "covers", "ok"),
    [
        # Round 5 of epoch 1 formed and reached X (its accept is cleared then): a proposal of
        # epoch 2 built on round 4 was made without it, whatever its number.
        (History(1, 5, (A, D, X)), None, History(2, 6, (D, X)), 4, frozenset(), False),
        (History(1, 5, (A, D, X)), None, History(2, 5, (D, X)), 4, frozenset(), False),
        (History(1, 5, (A, D, X)), None, History(2, 6, (D, X)), 5, frozenset(), True),
        (History(1, 5, (A, D, X)), None, History(1, 4, (A, X)), 3, frozenset(), False),  # older
        # X voted for epoch 1's round 5 (not known to have formed): epoch 2's proposal from
        # round 4 must account for it, or build on a base at least as new.
        (History(1, 4, (A, D, X)), History(1, 5, (A, X)), History(2, 5, (D, X)), 4, frozenset(), False),
        (
            History(1, 4, (A, D, X)),
            History(1, 5, (A, X)),
            History(2, 6, (D, X)),
            4,
            frozenset({(1, A, 5)}),
            True,
        ),
        (
            History(1, 4, (A, D, X)),
            History(1, 5, (A, X)),
            History(1, 6, (A, X)),
            4,
            frozenset(),
            True,
        ),  # its term
        (None, None, History(1, 1, (A, D, X)), 0, frozenset(), True),
    ],
)
def test_a_node_accepts_only_a_proposal_whose_leader_knew_what_it_knows(
    history, accepted, proposal, base, covers, ok
):
    assert may_accept(history, accepted, proposal, base, covers) is ok


def test_a_base_numbered_as_high_as_a_vote_excuses_it_only_on_the_votes_line():
    """Swarm seed 71000544: X voted for round 1 of an island (epoch 4), then got a proposal of
    the other island's leader built on its own round 1, sent as X said hello (before X's join
    told it anything). Round 1 of another line says nothing of X's vote."""
    island, other = (4, D, 1), (1, A, 1)
    vote = History(4, 1, (D, X), lines=(island,))
    proposal = History(1, 2, (A, X), lines=(other,))
    assert may_accept(None, vote, proposal, 1, frozenset()) is False
    assert may_accept(None, vote, proposal, 1, frozenset({island})) is True  # covered
    took_in = History(1, 2, (A, X), lines=(other, island))
    assert may_accept(None, vote, took_in, 1, frozenset()) is True  # it continues the vote's line
    # Where either names no lines (a release before lines), the number decides as it did.
    assert may_accept(None, History(4, 1, (D, X)), proposal, 1, frozenset()) is True


def test_a_line_named_by_a_later_round_of_the_votes_term_accounts_for_the_vote():
    """Swarm seed 72014687: X voted for A's first round (epoch 1), which never formed; A then
    formed round 2 alone, a line of its own. A proposal of epoch 4 built on that round 2 names
    its line: A proposed round 2 with no round formed, so round 1 never forms. Without this the
    node refused every proposal and the job never formed."""
    vote = History(1, 1, (A, X), lines=((1, A, 1),))
    proposal = History(4, 4, (D, A), lines=((1, A, 2), (1, D, 1)))
    assert may_accept(None, vote, proposal, 2, frozenset()) is True
    # A line of another term, or an earlier round of that term, says nothing of the vote.
    assert may_accept(None, vote, History(4, 4, (D, A), lines=((1, D, 2),)), 2, frozenset()) is False
    assert may_accept(None, History(1, 3, (A, X), lines=((1, A, 3),)), proposal, 2, frozenset()) is False


def test_a_node_accepts_only_a_proposal_that_accounts_for_its_earlier_votes_too():
    """Swarm seed 70000136: X voted for epoch 1's round 3 (it formed, X never heard), then for
    epoch 2's round 4, built on it. A proposal of epoch 3 built on round 2 that covers only
    round 4 was made without round 3: round 4 may never have formed, and round 3 then runs on."""
    two, three, four = History(1, 2, (A, D, X)), History(1, 3, (A, D, X)), History(2, 4, (D, A, X))
    proposal = History(3, 5, (X, A))
    assert may_accept(two, four, proposal, 2, frozenset({four.key}), (three,)) is False
    assert may_accept(two, four, proposal, 2, frozenset({four.key, three.key}), (three,)) is True
    assert may_accept(two, four, proposal, 3, frozenset({four.key}), (three,)) is True  # built on it
    its_term = History(1, 5, (A, X))
    assert may_accept(two, four, its_term, 2, frozenset({four.key}), (three,)) is True


def test_a_spare_waits_for_a_round_once_a_member_of_the_running_one_joined_again():
    """Swarm seed 898: the leader, its round's only member, joined again and found no quorum;
    a spare parked beside that round must wait with a deadline from then on, also once the
    member's join is gone (it timed out: its workers stopped all the same)."""
    b = book(min_nodes=1, max_nodes=1, last_call=0.0)
    first_round(b, (LEADER,))
    join(b, 0x20)
    assert b.runs() and b.parked(0x20)  # a spare beside a full, healthy round
    join(b, LEADER)  # the member's workers stopped: the next round is under way
    assert not b.runs() and not b.parked(0x20)
    b.withdraw(LEADER)  # its join timed out
    assert not b.runs() and not b.parked(0x20)
    form(b, Form(members=(0x20,), reason="test"))  # the next round runs, and parks no one of it
    assert b.runs() and not b.parked(0x20) and b.parked(LEADER)
