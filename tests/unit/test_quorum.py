"""The round rule with a quorum (pure): a round after the first needs a majority of the
previous round's members; a member that left leaves the voting set, a lost one (silent, or
its connection closed or reset: ``_evidence``) does not.

The model check drives real ``RoundBook``s (one per would-be leader) through every mix of
departures, losses and partitions among up to 5 nodes that hypothesis draws, and checks that
no two leaders form a round from the same previous round, and that a side holding a majority
does form one. Reports of a departure are true by construction here: only the node itself
says it leaves (a leader that leaves says so in its ``bye``), which
``test_follower_session.py`` checks.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from torch_mingle._frames import Join
from torch_mingle._quorum import quorum_met
from torch_mingle._records import Heard, History, Round
from torch_mingle._rounds import Form, JoinRequest, RoundBook, Wait
from torch_mingle._settings import RoundRules

PREVIOUS = History(epoch=1, round=3, members=(1, 2, 3, 4))


def book(leader: int, *, quorum: bool = True, min_nodes: int = 1, max_nodes: int = 8) -> RoundBook:
    return RoundBook(
        leader=leader,
        epoch=2,
        rules=RoundRules(min_nodes=min_nodes, max_nodes=max_nodes, last_call_timeout_s=1.0, quorum=quorum),
    )


def join(
    b: RoundBook,
    node: int,
    gone: frozenset[int] = frozenset(),
    history: History | None = PREVIOUS,
    left_from: History | None = None,
) -> None:
    # Each departure as a leader's bye reports it: with the round it left, by its own word
    # (``left_from``, else the joiner's ``history``).
    left_from = left_from or history
    left = tuple((n, left_from.key if left_from else None) for n in sorted(gone))
    b.join(JoinRequest(node=node, join=Join(0, f"198.18.0.{node}", gone=left), history=history), 0.0)


def test_a_half_of_the_previous_round_never_forms_a_round():
    b = book(1)
    join(b, 1)
    join(b, 2)
    d = settle(b)  # long after the last call
    assert isinstance(d, Wait)
    assert "no quorum: 2 of the 4 voting members of round 3 joined, 3 needed" in d.reason
    join(b, 3)
    assert isinstance(settle(b), Form)


def test_three_of_four_go_on_and_the_silent_fourth_keeps_its_vote():
    b = book(2)
    for node in (2, 3, 4):
        join(b, node)
    d = settle(b)
    assert isinstance(d, Form) and set(d.members) == {2, 3, 4}
    assert b.voters() == {1, 2, 3, 4}  # node 1 (the old leader) is silent, not known gone


def test_members_that_leave_leave_the_voting_set_so_leaves_one_by_one_go_down_to_min_nodes():
    b = book(1)
    for node in (1, 2, 3, 4):
        join(b, node, history=None)
    members = form(b, settle(b))
    assert members == (1, 2, 3, 4)
    for gone, survivors in ((4, (1, 2, 3)), (3, (1, 2)), (2, (1,))):
        b.leave(gone)
        last = b.current
        assert last is not None
        for node in survivors:
            join(b, node, history=History(epoch=2, round=last.number, members=last.members))
        d = settle(b)
        assert isinstance(d, Form) and d.members == survivors, d
        form(b, d, 20.0 + gone)


def test_a_reset_is_not_a_departure_so_kills_one_by_one_stop_at_half_of_the_last_round():
    """A connection closed or reset proves nothing a partition could not produce: a member
    killed keeps its vote. Three of four go on, two of three go on, one of two waits (it may be
    one half of a partition) until the other returns or leaves, or join_timeout ends."""
    b = book(1)
    for node in (1, 2, 3, 4):
        join(b, node, history=None)
    form(b, settle(b))
    for dead, survivors in ((4, (1, 2, 3)), (3, (1, 2))):
        b.died(dead, "connection reset by peer")
        last = b.current
        assert last is not None
        for node in survivors:
            join(b, node, history=History(epoch=2, round=last.number, members=last.members))
        d = settle(b)
        assert isinstance(d, Form) and d.members == survivors, d
        form(b, d, 20.0 + dead)
    b.died(2, "connection reset by peer")
    join(b, 1, history=History(epoch=2, round=b.last_round_number, members=(1, 2)))
    d = settle(b)
    assert isinstance(d, Wait) and "no quorum: 1 of the 2 voting members" in d.reason


def test_a_silent_member_is_not_gone_so_two_of_four_wait():
    b = book(1)
    for node in (1, 2, 3, 4):
        join(b, node, history=None)
    form(b, settle(b))
    b.died(3, "no heartbeat for 3s")
    b.died(4, "no heartbeat for 3s")
    for node in (1, 2):
        join(b, node, history=History(epoch=2, round=1, members=(1, 2, 3, 4)))
    assert isinstance(settle(b), Wait)


def test_a_joiner_reports_its_lost_leader_gone_and_the_survivor_of_two_goes_on():
    b = book(2)
    two = History(epoch=1, round=5, members=(1, 2))
    join(b, 2, history=two)
    assert isinstance(settle(b), Wait)  # leader 1 may be alive across a partition
    join(b, 2, gone=frozenset({1}), history=two)  # its bye said it leaves the job
    d = settle(b)
    assert isinstance(d, Form) and d.members == (2,)


def test_a_node_that_left_a_later_round_still_votes_on_an_older_one():
    # Node 4 left round 4 (its leader's bye said so). A joiner that missed round 4 brings round
    # 3: node 4's vote there may be what formed round 4, so it still counts on round 3.
    b = book(1)
    later = History(epoch=1, round=4, members=(1, 2, 3, 4))
    join(b, 1, history=later, gone=frozenset({4}))
    join(b, 2, history=PREVIOUS)
    assert b.ledger.voters_of(later.members, later.key) == {1, 2, 3}
    assert b.ledger.voters_of(PREVIOUS.members, PREVIOUS.key) == {1, 2, 3, 4}


def test_spares_alone_never_form_a_round_of_a_job_that_ran():
    b = book(5)
    b.hear(Heard(((1, 1, 3),)))  # it followed a leader that announced round 3
    join(b, 5, history=None)
    join(b, 6, history=None)
    d = settle(b)
    assert (
        isinstance(d, Wait)
        and "round 3 of this job (epoch 1, leader 0000000000000001) ran, and none of its members joined"
        in d.reason
    )
    join(b, 1)
    join(b, 2)
    join(b, 3)
    assert isinstance(settle(b), Form)


def test_a_side_that_heard_of_another_sides_first_round_forms_none_beside_it():
    """Seed 29186: a one-way split as the job starts; each side forms a round 1 of its own, and
    the side that hears the other one's announcements formed its round 2 beside it. A round
    heard of by its key, with none of its members among the joiners, leaves no quorum, whichever
    side sorts first; a member of it that joins brings its voters, and a majority of them is
    then needed too (``rivals``)."""
    for other_leader in (0x9, 0x1):  # the other round sorts after ours, or before it
        ours = History(epoch=1, round=1, members=(5, 6, 7))
        theirs = History(epoch=1, round=1, members=(other_leader, 2, 3))
        b = book(5)
        for node in (5, 6, 7):
            join(b, node, history=ours)
        b.hear(Heard((theirs.key,)))
        d = settle(b)
        assert isinstance(d, Wait), d
        assert (
            f"round 1 of this job (epoch 1, leader {other_leader:016x}) ran, and none of its members"
            in d.reason
        )
        join(b, 2, history=theirs)
        d = settle(b)
        assert isinstance(d, Wait) and "1 of the 3 voting members of round 1" in d.reason
        join(b, 3, history=theirs)
        d = settle(b)
        assert isinstance(d, Form), d
        assert {frozenset(ours.members), frozenset(theirs.members)} <= set(d.constraints)


def test_a_round_of_another_line_numbered_below_the_base_still_needs_its_majority():
    """Seed 891: two sides of a split at the job's start each founded a line; one went on to its
    round 2, and a member of the other's round 1 crossed over when the split moved. Numbered
    below the base, its round could not be told from an ancestor of the base; the line each
    round names (``Round.lines``) tells them apart, and the round that takes it in takes the
    other line in too."""
    ours = History(epoch=1, round=2, members=(5, 6, 7), lines=((1, 5, 1),))
    theirs = History(epoch=1, round=1, members=(1, 2, 3, 4), lines=((1, 1, 1),))
    ancestor = History(epoch=1, round=1, members=(5, 6, 7, 8), lines=((1, 5, 1),))
    b = book(5)
    for node in (5, 6, 7):
        join(b, node, history=ours)
    join(b, 8, history=ancestor)  # a member of our own line's round 1: no rival
    assert b.rivals() == []
    join(b, 2, history=theirs)
    d = settle(b)
    assert (
        isinstance(d, Wait) and "1 of the 4 voting members of round 1 of epoch 1 (another line" in d.reason
    ), d
    join(b, 3, history=theirs)
    join(b, 4, history=theirs)
    d = settle(b)
    assert isinstance(d, Form), d
    assert frozenset(theirs.members) in d.constraints and d.lines == ((1, 5, 1), (1, 1, 1))
    # And it names that round in ``covers``, where its voters and a later leader that covers
    # this proposal see it (seed 64005782: a later term covered such a proposal, which named
    # nothing, and built beside the rival round).
    assert d.covers == (theirs.key,)


def test_the_leaders_own_round_is_a_rival_when_a_joiner_of_another_line_brings_a_higher_base():
    """From a review: a leader runs round 3 of its line; two members of the other line's round 7
    join it, and their round becomes the base (the higher number). The leader's own round may go
    on where its other members are: it needs their majority too, not only round 7's."""
    b = book(1)
    for node in (1, 2, 3, 4, 5):
        join(b, node, history=None)
    d = settle(b)
    assert isinstance(d, Form) and d.lines == ((2, 1, 1),)
    own = d.members
    b.formed(Round(number=d.number, epoch=2, members=own, store_ip="x", store_port=1, lines=d.lines), 10.0)
    theirs = History(epoch=1, round=7, members=(9, 7, 8), lines=((1, 9, 1),))
    for node in (1, 7, 8):
        join(b, node, history=theirs if node != 1 else b._current_history)
    d = settle(b)
    assert (
        isinstance(d, Wait) and "1 of the 5 voting members of round 1 of epoch 2 (another line" in d.reason
    ), d
    join(b, 2, history=b._current_history)
    join(b, 3, history=b._current_history)
    d = settle(b)
    assert isinstance(d, Form) and frozenset(own) in d.constraints, d


def test_of_the_rounds_of_one_other_line_only_the_newest_needs_a_majority():
    """From a review: a stale member brings round 1 of the other line, others its round 7 (a
    later term of that line): round 7 was formed by a majority of the rounds before it, so the
    voters of round 1, long gone, must not keep the job waiting."""
    ours = History(epoch=1, round=9, members=(1, 2, 3), lines=((1, 1, 1),))
    old = History(epoch=1, round=1, members=(20, 21, 22), lines=((1, 20, 1),))
    new = History(epoch=1, round=7, members=(23, 24, 25), lines=((1, 20, 1),))
    b = book(1)
    for node in (1, 2, 3):
        join(b, node, history=ours)
    join(b, 20, history=old)
    join(b, 23, history=new)
    join(b, 24, history=new)
    assert [h.key for h in b.rivals()] == [new.key]
    assert isinstance(settle(b), Form)


def test_a_key_that_names_no_round_is_nothing_heard():
    assert not Heard().with_keys((0, 5, 1), (1, 0, 1), (1, 5, 0), None)
    assert Heard.of([[0, "05", 1]]) == Heard()


def test_a_terms_withdrawn_first_proposal_is_no_rival_of_the_round_it_formed_next():
    """Seed 1772: a term proposed a first round that did not form, then another that did; a
    node that accepted the first, joining a later term, must not make it wait for the voters
    of a round that never was: a term's rounds and proposals are one chain. Each founds a line
    of its own (seed 5001326: a round that took the first proposal's majority in does not take
    in the line the second founded)."""
    b = book(5)
    for node in (5, 6):
        join(b, node, history=None)
    first = settle(b)
    assert isinstance(first, Form) and first.lines == ((2, 5, 1),)
    b.proposed(first.number)
    second = b.decide(200.0)
    assert isinstance(second, Form) and second.number == 2 and second.lines == ((2, 5, 2),)
    formed = History(epoch=2, round=2, members=(5, 6), lines=second.lines)
    withdrawn = History(epoch=2, round=1, members=(5, 6, 7), lines=first.lines)
    later = book(6)
    later.epoch = 3
    join(later, 5, history=formed)
    join(later, 6, history=formed)
    later.join(
        JoinRequest(node=7, join=Join(0, "198.18.0.7", accepted=withdrawn, seen=Heard((withdrawn.key,)))), 0.0
    )
    assert later.rivals() == []
    assert isinstance(settle(later), Form)


def test_a_round_heard_of_that_a_joiner_accepted_as_a_proposal_counts_by_its_voters():
    """Seeds 16915 and 28325: a first round formed while its leader was cut off from the other
    members, so it reached only the leader, which then left. The others hold it as the
    proposal they accepted, and heard that it ran: its key names that proposal, so its voters
    count (a majority of them), and the survivors go on without waiting for ``join_timeout``."""
    proposal = History(epoch=1, round=1, members=(9, 1, 2, 3, 4))
    b = book(1, min_nodes=4)
    for node in (1, 2, 3, 4):
        b.join(
            JoinRequest(
                node=node, join=Join(0, f"198.18.0.{node}", accepted=proposal, seen=Heard((proposal.key,)))
            ),
            0.0,
        )
    d = settle(b)
    assert isinstance(d, Form) and set(d.members) == {1, 2, 3, 4}, d
    assert frozenset(proposal.members) in d.constraints
    other = History(epoch=1, round=1, members=(8, 1, 2, 3, 4))  # the same number, another term
    b = book(1, min_nodes=4)
    for node in (1, 2, 3, 4):
        b.join(
            JoinRequest(
                node=node, join=Join(0, f"198.18.0.{node}", accepted=proposal, seen=Heard((other.key,)))
            ),
            0.0,
        )
    d = settle(b)
    assert isinstance(d, Wait) and "leader 0000000000000008) ran, and none of its members" in d.reason


def test_quorum_none_goes_on_with_any_min_nodes():
    b = book(1, quorum=False)
    join(b, 1)
    assert isinstance(settle(b), Form)


def test_the_first_round_of_a_job_needs_no_quorum():
    b = book(1, min_nodes=1)
    join(b, 1, history=None)
    assert isinstance(settle(b), Form)


def settle(b: RoundBook) -> Form | Wait:
    """Decide once, then again after the last call: what the book does once nobody else comes."""
    b.decide(0.0)
    return b.decide(100.0)


def form(b: RoundBook, d: Form | Wait, now: float = 10.0) -> tuple[int, ...]:
    assert isinstance(d, Form), d
    b.formed(
        Round(number=b.last_round_number + 1, epoch=b.epoch, members=d.members, store_ip="x", store_port=1),
        now,
    )
    return d.members


# ------------------------------------------------------------------ model check

NODES = (1, 2, 3, 4, 5)


@st.composite
def scenarios(draw):
    """A previous round, who left (and who heard that they left), and a partition of the rest."""
    members = tuple(draw(st.lists(st.sampled_from(NODES), min_size=1, max_size=5, unique=True)))
    outsiders = [n for n in NODES if n not in members]  # spares: alive, never in the round
    dead = set(draw(st.lists(st.sampled_from(members), unique=True, max_size=len(members))))
    alive = [n for n in NODES if n not in dead]
    sides = draw(st.lists(st.integers(0, 2), min_size=len(alive), max_size=len(alive)))
    groups: dict[int, list[int]] = {}
    for node, side in zip(alive, sides, strict=True):
        groups.setdefault(side, []).append(node)
    # That a node left reaches only some nodes (those that were connected to it).
    seen = {n: frozenset(d for d in dead if draw(st.booleans())) for n in alive}
    min_nodes = draw(st.integers(1, 3))
    quorate_spares = draw(st.booleans())
    return members, outsiders, dead, list(groups.values()), seen, min_nodes, quorate_spares


@settings(max_examples=600, deadline=None)
@given(scenarios())
def test_no_two_leaders_form_a_round_from_the_same_previous_round(scenario):
    members, outsiders, dead, groups, seen, min_nodes, with_spares = scenario
    previous = History(epoch=1, round=7, members=members)
    formed = []
    for group in groups:
        # Any node of a side may lead it (the election picks one); each leads its own book.
        for leader in group:
            b = book(leader, min_nodes=min_nodes, max_nodes=5)
            b.hear(Heard((previous.key,)))  # every node of the job heard of it (spares too)
            joined = [n for n in group if with_spares or n not in outsiders]
            for node in joined:
                hist = previous if node in members else None
                join(b, node, gone=seen[node], history=hist, left_from=previous)
            for node in dead:
                if node in seen[leader]:
                    b.leave(node, previous.key)  # its leave names its newest round
                else:
                    b.died(node, "lost")
            formed_here = False
            for now in (0.0, 5.0):
                d = b.decide(now)  # at once, and after the last call
                if isinstance(d, Form):
                    formed.append((leader, frozenset(d.members)))
                    formed_here = True
                    break
            # Liveness: a side whose leader holds a strict majority of the votes it knows of
            # forms a round (the rule is not just "never").
            known_gone = set().union(*(seen[n] for n in joined), {d for d in dead if d in seen[leader]})
            voters = set(members) - known_gone
            quorate = not voters or 2 * len(voters.intersection(joined)) > len(voters)
            can_count = any(n in members for n in joined)  # else only spares: no previous round known
            if leader in joined and len(joined) >= min_nodes and quorate and can_count:
                assert formed_here, f"{leader} holds {joined} of voters {voters} and formed nothing"
    leaders_by_side = [{leader for leader, _ in formed if leader in group} for group in groups]
    sides_that_formed = sum(1 for leaders in leaders_by_side if leaders)
    assert sides_that_formed <= 1, f"two sides formed a round from round 7 of {members}: {formed}"


def test_a_departure_counts_for_the_newest_round_its_node_voted_for_not_the_leaders_round():
    # Node 2 ran round 3 of {1,2,3,4}, then accepted round 4 of another term, {2,3,5}, which
    # may have formed. It joins a leader whose round is still round 3, and leaves. Filed under
    # round 3, its vote there would be dropped: {1,4} would hold 2 of 3 and form a second
    # successor of round 3 beside round 4.
    b = book(1)
    b.current = Round(number=3, epoch=1, members=(1, 2, 3, 4), store_ip="198.18.0.1", store_port=1)
    assert b.current_key() == PREVIOUS.key
    other = History(epoch=3, round=4, members=(5, 2, 3))
    b.join(JoinRequest(node=2, join=Join(0, "198.18.0.2", accepted=other), history=PREVIOUS), 0.0)
    b.leave(2)
    assert b.ledger.left_in(2) == other.key
    assert 2 in b.ledger.voters_of(PREVIOUS.members, PREVIOUS.key)
    assert 2 not in b.ledger.voters_of(other.members, other.key)


def test_a_leader_accounts_for_the_earlier_votes_a_joiner_reports():
    """Swarm seed 70000136: a joiner's vote (round 4 of epoch 3) replaced an earlier one of
    another term (round 3 of epoch 2) that may have formed: the next round needs a majority of
    the voters of each, told by the join or by a refusal."""
    b = book(1)
    b.current = Round(number=2, epoch=1, members=(1, 2, 3, 4), store_ip="198.18.0.1", store_port=1)
    three = History(epoch=2, round=3, members=(5, 2, 3, 4))
    four = History(epoch=3, round=4, members=(6, 2))
    b.join(JoinRequest(node=2, join=Join(0, "198.18.0.2", accepted=four, earlier=(three,))), 0.0)
    assert {p.key for p in b.uncertain()} == {three.key, four.key}
    learnt = book(1)
    learnt.current = b.current
    learnt.learn(None, four, (three,))
    assert {p.key for p in learnt.uncertain()} == {three.key, four.key}


def test_a_departure_by_its_own_word_counts_for_its_round_and_an_unknown_one_for_none():
    b = book(1)
    later = History(epoch=3, round=7, members=(1, 2))
    b.leave(2, later.key)  # its leave frame named round 7
    assert b.ledger.voters_of(later.members, later.key) == {1}
    assert b.ledger.voters_of(PREVIOUS.members, PREVIOUS.key) == {1, 2, 3, 4}
    b.leave(3)  # nothing known of node 3's rounds: it keeps its vote everywhere
    assert b.ledger.left_in(3) is None
    b.join(JoinRequest(node=4, join=Join(0, "198.18.0.4", gone=((3, None),)), history=PREVIOUS), 0.0)
    assert b.ledger.voters_of(PREVIOUS.members, PREVIOUS.key) == {1, 2, 3, 4}


def test_a_leader_gives_way_to_a_joiner_that_ran_a_round_of_a_higher_epoch_in_any_lineage():
    # Node 3 was cut off before round 1 of epoch 1 reached it, and formed round 1 of epoch 2
    # with others of its side. A round of ours (epoch 1) would take its token back.
    b = RoundBook(leader=1, epoch=1, rules=RoundRules(min_nodes=1, max_nodes=8, last_call_timeout_s=1.0))
    join(b, 1, history=History(epoch=1, round=5, members=(1, 2)))
    join(b, 2, history=History(epoch=1, round=5, members=(1, 2)))
    assert b.outdated_by() is None
    join(b, 3, history=History(epoch=2, round=1, members=(3, 4)))
    assert b.outdated_by() == 2


def test_a_round_of_no_base_needs_every_member_also_beside_a_proposal_it_accounts_for():
    """Seed 19061: a proposal of another term, accepted by one node and never formed, made the
    next round of no base a majority round; two members never heard of it and founded a job
    of their own. It is the first round of its line: every member must accept it."""
    b = book(1, max_nodes=6)
    proposal = History(epoch=1, round=1, members=(3, 4, 5))
    join(b, 3, history=None)
    b.join(JoinRequest(node=4, join=Join(0, "198.18.0.4", accepted=proposal)), 0.0)
    for node in (1, 2, 5, 6):
        join(b, node, history=None)
    d = settle(b)
    assert isinstance(d, Form) and d.unanimous and d.base == 0
    members, voters = d.constraints[0], d.constraints[1]
    assert members == frozenset(d.members) and voters == frozenset({3, 4, 5})
    assert not quorum_met(d.constraints, {1, 2, 3, 4, 5}, every=True)  # member 6 has not accepted
    assert quorum_met(d.constraints, set(d.members), every=True)
    assert not quorum_met((frozenset({1, 2, 3}), frozenset({4, 5, 6})), {1, 2, 3, 4}, every=True)
    assert quorum_met((frozenset({1, 2, 3}), frozenset({4, 5, 6})), {1, 2, 3, 4, 5}, every=True)
