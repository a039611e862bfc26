"""Round decisions (pure): admission, rank order, last call, re-rendezvous, spares, close."""

from __future__ import annotations

from torch_mingle._rounds import Form, History, JoinRequest, Round, RoundBook, Status, Wait

LEADER = 0x10


def book(min_nodes=2, max_nodes=4, last_call=30.0, epoch=1):
    return RoundBook(
        leader=LEADER, epoch=epoch, min_nodes=min_nodes, max_nodes=max_nodes, last_call_timeout=last_call
    )


def join(b: RoundBook, node: int, seq: int, history: History | None = None) -> None:
    b.join(JoinRequest(node=node, seq=seq, ip="198.18.0.1", history=history))


def form(b: RoundBook, decision: Form | Wait) -> Round:
    assert isinstance(decision, Form), decision
    rnd = Round(
        number=b.last_round_number + 1, epoch=b.epoch, members=decision.members, store_ip="x", store_port=1
    )
    b.formed(rnd)
    return rnd


def first_round(b: RoundBook, nodes: tuple[int, ...]) -> Round:
    """The first round of a job below max_nodes forms after the last call, as in c10d."""
    for seq, node in enumerate(nodes, start=1):
        join(b, node, seq)
    b.decide(0.0)
    return form(b, b.decide(b.last_call_timeout))


def test_no_round_without_the_leader_even_at_max_nodes():
    b = book(min_nodes=2, max_nodes=2)
    join(b, 0x20, 1)
    join(b, 0x30, 2)
    assert isinstance(b.decide(0.0), Wait)
    join(b, LEADER, 3)
    d = b.decide(0.0)
    assert isinstance(d, Form)
    assert d.members == (LEADER, 0x20)  # leader first, then arrival order; 0x30 is a spare
    assert d.admitted == (3, 1)


def test_max_nodes_forms_at_once_and_min_nodes_waits_for_the_last_call():
    b = book(min_nodes=2, max_nodes=4, last_call=30.0)
    join(b, LEADER, 1)
    assert b.decide(0.0) == Wait(until=None, reason="1 of min_nodes=2 nodes joined")
    join(b, 0x20, 2)
    d = b.decide(1.0)
    assert isinstance(d, Wait)
    assert d.until == 31.0
    join(b, 0x30, 3)
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
    join(b, 0x30, 4)
    join(b, LEADER, 5)
    assert isinstance(b.decide(101.0), Wait)
    join(b, 0x20, 6)
    d = b.decide(101.0)
    assert isinstance(d, Form)
    assert d.members == (LEADER, 0x20, 0x30)  # previous members keep their order
    assert "re-joined" in d.reason


def test_a_dead_member_makes_the_round_stale_and_is_not_waited_for():
    b = book(min_nodes=2, max_nodes=4)
    first_round(b, (LEADER, 0x20, 0x30))
    assert b.status().stale is False
    assert b.died(0x20) is None
    assert b.status().stale is True
    join(b, LEADER, 4)
    join(b, 0x30, 5)
    d = b.decide(1.0)
    assert isinstance(d, Form)
    assert d.members == (LEADER, 0x30)


def test_a_new_leader_recognizes_a_re_rendezvous_from_the_joiners_history():
    # Old leader 0x99 died; the survivors carry round 7 of epoch 3 to the new leader (epoch 4).
    hist = History(epoch=3, round=7, members=(0x99, 0x30, LEADER, 0x20))
    b = book(min_nodes=2, max_nodes=4, epoch=4)
    join(b, LEADER, 1, hist)
    join(b, 0x20, 2, hist)
    assert isinstance(b.decide(0.0), Wait)  # 0x30 was in that round and is expected back
    join(b, 0x30, 3, hist)
    d = b.decide(0.0)
    assert isinstance(d, Form)
    assert d.members == (LEADER, 0x30, 0x20)  # survivors keep their relative order
    rnd = form(b, d)
    assert rnd.number == 8  # round numbers continue across terms


def test_spares_wait_beyond_max_nodes_and_replace_a_dead_node():
    b = book(min_nodes=2, max_nodes=2)
    join(b, LEADER, 1)
    join(b, 0x20, 2)
    join(b, 0x30, 3)
    form(b, b.decide(0.0))
    assert b.pending.keys() == {0x30}
    assert b.status().waiting == 0  # the round is full: a spare does not trigger restarts
    b.died(0x20)
    assert b.status().waiting == 1
    join(b, LEADER, 4)
    d = b.decide(1.0)
    assert isinstance(d, Form)
    assert d.members == (LEADER, 0x30)


def test_newcomers_count_as_waiting_while_there_is_room():
    b = book(min_nodes=2, max_nodes=3)
    first_round(b, (LEADER, 0x20))
    join(b, 0x30, 3)
    join(b, 0x40, 4)
    assert b.status().waiting == 1  # room for one more node


def test_close_answers_every_waiting_join():
    b = book()
    join(b, LEADER, 1)
    join(b, 0x20, 2)
    assert sorted(b.close()) == [1, 2]
    assert b.decide(0.0) == Wait(until=None, reason="closed")
    assert b.status().closed
    assert b.status().waiting == 0


def test_all_gone_once_every_other_node_left_or_died():
    b = book(min_nodes=3, max_nodes=3)
    for seq, node in enumerate((LEADER, 0x20, 0x30), start=1):
        join(b, node, seq)
    form(b, b.decide(0.0))
    b.close()
    assert not b.all_gone()
    b.leave(0x20)
    assert not b.all_gone()
    b.died(0x30)
    assert b.all_gone()


def test_departed_are_the_current_rounds_members_that_left_or_died_until_they_rejoin():
    b = book(min_nodes=2, max_nodes=3)
    for seq, node in enumerate((LEADER, 0x20, 0x30), start=1):
        join(b, node, seq)
    form(b, b.decide(0.0))
    join(b, 0x40, 4)
    b.leave(0x40)  # not a member: its leaving holds nobody's exit barrier
    b.leave(0x20)
    b.died(0x30)
    assert b.departed() == {0x20, 0x30}
    join(b, 0x30, 5)
    assert b.departed() == {0x20}
    join(b, LEADER, 6)
    form(b, b.decide(0.0))  # a new round: nobody of it has left yet
    assert b.departed() == set()


def test_round_and_status_encode_round_trip():
    rnd = Round(number=3, epoch=2, members=(1, 2, 3), store_ip="fd00::1", store_port=4)
    assert Round.decode(rnd.encode()) == rnd
    st = Status(epoch=1, round=2, size=3, joined=1, waiting=1, stale=False, closed=False, reason="x")
    assert Status.decode(st.encode()) == st
    hist = History(epoch=1, round=2, members=(5, 6))
    assert History.from_json(hist.to_json()) == hist
