"""Who is gone (``_ledger``): the standings, their rules, and ``check``, which the swarm runs
after every step."""

from __future__ import annotations

from torch_mingle._ledger import Ledger

R1, R2 = (1, 7, 1), (1, 7, 2)


def test_a_departure_takes_the_vote_on_its_rounds_successor_only():
    ledger = Ledger()
    ledger.leave(2, R2)
    assert ledger.voters_of((1, 2, 3), R2) == {1, 3}
    assert ledger.voters_of((1, 2, 3), R1) == {1, 2, 3}  # its vote there may have formed R2
    ledger.reported_gone(2, R1)  # an older report never files it under an older round
    assert ledger.left_in(2) == R2


def test_a_lost_node_keeps_its_vote_and_a_node_that_left_is_not_lost():
    ledger = Ledger()
    assert ledger.died(3, "silent") and ledger.voters_of((3,), R1) == {3} and not ledger.live(3)
    ledger.leave(4, R1)
    assert not ledger.died(4, "closed") and 4 not in ledger.lost
    assert ledger.out_of({3, 4, 5}) == {3, 4} and ledger.out_of([5, 3]) == {3}


def test_a_join_or_a_revival_clears_the_standing_but_not_the_drops():
    ledger = Ledger()
    ledger.died(3, "silent")
    ledger.died(3, "silent")
    ledger.revive(3)
    assert ledger.live(3) and ledger.drops == {3: 1} and 3 not in ledger.lost_why
    ledger.died(3, "reset")
    ledger.said_it_left(3, R1)
    ledger.joined(3)
    assert ledger.live(3) and ledger.left_in(3) is None and ledger.drops == {3: 2}
    assert ledger.check() == []


def test_check_names_every_standing_that_disagrees():
    ledger = Ledger()
    ledger._left_in[5] = R1  # filed, but it neither left nor is gone
    ledger.lost.add(6)  # lost without a reason
    ledger.lost_why[7] = "silent"  # a reason without a drop
    problems = ledger.check()
    assert len(problems) == 3 and all(str(n) in p for n, p in zip((5, 6, 7), problems, strict=True))
