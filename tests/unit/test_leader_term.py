"""The leader's term, sans I/O: which nodes are told the next round's store (``next``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tests.helpers import dicts_of, node_said
from torch_mingle._claims import Claim
from torch_mingle._door import MAX_UNIDENTIFIED
from torch_mingle._frames import Join, Propose
from torch_mingle._jobs import OpenStore
from torch_mingle._leader import LeaderTerm
from torch_mingle._ports import NEXT_STORE_DELAY_S
from torch_mingle._record import replace
from torch_mingle._records import History, Round, node_hex
from torch_mingle._rounds import RoundBook, Wait
from torch_mingle._settings import Beats, RoundRules

LEADER = 0x1


def _term(min_nodes: int, max_nodes: int) -> LeaderTerm:
    book = RoundBook(
        leader=LEADER,
        epoch=1,
        rules=RoundRules(min_nodes, max_nodes, 1.0),
    )
    term = LeaderTerm(
        claim=Claim(1, LEADER),
        book=book,
        advertised_ip="198.18.0.1",
        beats=Beats(1.0, 3.0),
        label="",
    )
    term.start(0.0)
    assert term.jobs() == [OpenStore()]
    return term


def _store_opened(term: LeaderTerm, port: int, now: float) -> None:
    term.job_done(OpenStore(), port, None, now)


def _leader_joined(term: LeaderTerm) -> None:
    """The next round's store is open (5001) and the leader's own agent joined (ticket 1)."""
    _store_opened(term, 5001, 0.1)
    term.join_local(Join(1, "198.18.0.1", timeout_s=60.0, remaining_s=60.0), 0.1)


def _connect(term: LeaderTerm, conn: int, node: int, now: float, *, ahead: bool = True) -> None:
    term.accepted(conn, now)
    _hello(term, conn, node, now, ahead=ahead)


def _hello(term: LeaderTerm, conn: int, node: int, now: float, *, ahead: bool = True) -> None:
    hello: dict[str, Any] = {"t": "hello", "node": f"{node:016x}", "epoch": 1, "leader": f"{LEADER:016x}"}
    hello["ip"] = f"198.18.0.{node}"
    if ahead:
        hello["ahead"] = True
    term.received(conn, node_said([hello]), now)


def _join(term: LeaderTerm, conn: int, ticket: int, now: float) -> None:
    term.received(
        conn, node_said([{"t": "join", "id": ticket, "ip": "x", "timeout": 60, "remaining": 60}]), now
    )


def _round_of_two() -> LeaderTerm:
    """Round 1 of the leader and node 2 (connection 10, join 7), on store 5001, its votes in."""
    term = _term(2, 2)
    _leader_joined(term)
    _connect(term, 10, 2, 0.2)
    _join(term, 10, 7, 0.3)
    _vote(term, 0.3)
    return term


def _vote(term: LeaderTerm, now: float) -> None:
    """Every node the term proposed a round to accepts it at once (the leader's own node too);
    what the term sent stays queued for ``_sent``."""
    sent: list[tuple[int, bytes]] = []
    while True:
        voted = False
        for answer in term.local():
            if isinstance(answer, Propose):
                term.accept_local(answer.round.number, now)
                voted = True
        for conn, frame in term.frames():
            sent.append((conn, frame))
            frames = dicts_of(frame)
            assert isinstance(frames, list)
            for f in frames:
                if f["t"] == "propose" and conn in term.conns:
                    term.received(
                        conn, node_said([{"t": "accept", "round": f["round"]["round"], "ok": True}]), now
                    )
                    voted = True
        if not voted:
            term._frames[:0] = sent
            return


def _sent(term: LeaderTerm) -> dict[int, list[dict[str, Any]]]:
    """What the term sent, each connection's frames in order; every node it proposed a round
    to accepts it at once (the leader's own node too), as nodes with nothing else to report do."""
    out: dict[int, list[dict[str, Any]]] = {}
    while True:
        voted = False
        for answer in term.local():
            if isinstance(answer, Propose):
                term.accept_local(answer.round.number, term._now)
                voted = True
        for conn, frame in term.frames():
            frames = dicts_of(frame)
            assert isinstance(frames, list)
            out.setdefault(conn, []).extend(frames)
            for f in frames:
                proposal = term.vote.current  # only what still waits for votes (``_vote`` answered the rest)
                number = f["round"]["round"] if f["t"] == "propose" else None
                if proposal is not None and proposal.round.number == number and conn in term.conns:
                    term.received(conn, node_said([{"t": "accept", "round": number, "ok": True}]), term._now)
                    voted = True
        if not voted:
            return out


def _nexts(sent: dict[int, list[dict[str, Any]]], conn: int) -> list[int]:
    return [f["port"] for f in sent.get(conn, []) if f["t"] == "next"]


def test_a_waiting_join_is_told_the_spare_store_once_it_is_open_and_only_once():
    term = _term(3, 3)
    _connect(term, 10, 2, 0.1)
    _join(term, 10, 7, 0.2)
    assert _nexts(_sent(term), 10) == []  # no store open yet
    _store_opened(term, 5001, 0.3)
    assert _nexts(_sent(term), 10) == [5001]
    _join(term, 10, 8, 0.4)  # a newer join of the same node: the same store, not said again
    assert _nexts(_sent(term), 10) == []


def test_a_node_welcomed_when_the_store_is_open_is_told_before_it_joins():
    term = _term(3, 3)
    _store_opened(term, 5001, 0.1)
    _connect(term, 10, 2, 0.2)
    sent = _sent(term)
    assert [f["t"] for f in sent[10]] == ["welcome", "next"]
    assert _nexts(sent, 10) == [5001]


def test_the_join_that_completes_a_round_is_not_told_a_store_it_will_not_wait_for():
    term = _term(2, 2)
    _leader_joined(term)
    _connect(term, 10, 2, 0.2, ahead=True)
    _sent(term)
    _join(term, 10, 7, 0.3)  # round 1 forms on 5001 at once; the next spare is not open yet
    sent = _sent(term)
    assert [f["t"] for f in sent[10] if f["t"] in ("round", "next")] == ["round"]


def test_an_older_node_that_did_not_ask_for_it_never_gets_a_next_frame():
    term = _term(3, 3)
    _store_opened(term, 5001, 0.1)
    _connect(term, 10, 2, 0.2, ahead=False)
    _join(term, 10, 7, 0.3)
    assert _nexts(_sent(term), 10) == []


def test_a_spare_parked_behind_a_running_round_is_not_told_until_it_is_admitted():
    term = _round_of_two()
    sent = _sent(term)
    assert _nexts(sent, 10) == [5001]
    assert any(f["t"] == "round" for f in sent[10])  # round 1 on store 5001
    _store_opened(term, 5002, 0.4)  # the spare for round 2
    _connect(term, 11, 3, 0.5)
    _join(term, 11, 9, 0.6)  # a third node: the round of two runs, it is parked
    sent = _sent(term)
    assert [f["parked"] for f in sent[11] if f["t"] == "wait"] == [True]
    assert _nexts(sent, 11) == []


def test_a_running_member_is_told_the_next_rounds_store_once_it_opens():
    """After a failure every member re-joins at once: each has its client of that store already."""
    term = _round_of_two()
    _sent(term)
    _store_opened(term, 5002, 0.4)  # the spare for round 2, while round 1 runs
    assert _nexts(_sent(term), 10) == [5002]
    assert term.spare_port == 5002  # the leader's own agent reads it from the term
    _join(term, 10, 8, 0.5)  # the re-join after a failure: the same store, not said again
    assert _nexts(_sent(term), 10) == []


def _statuses(sent: dict[int, list[dict[str, Any]]], conn: int) -> list[dict[str, Any]]:
    return [f["status"] for f in sent.get(conn, []) if f["t"] == "status"]


def test_joins_received_in_one_batch_make_one_decision_before_any_output():
    # A first round of N joins costs one decision per batch of frames, not one per join (at
    # 16,384 members that was 2.6 s of the leader's CPU); and nothing the term says goes out
    # before that decision is made.
    term = _term(3, 3)
    _leader_joined(term)
    for conn, node in ((10, 2), (11, 3)):
        _connect(term, conn, node, 0.2)
    term.frames()
    decisions: list[float] = []
    decide = term.book.decide

    def counted(now: float) -> Any:
        decisions.append(now)
        return decide(now)

    term.book.decide = counted  # type: ignore[method-assign]
    _join(term, 10, 7, 0.3)
    _join(term, 11, 8, 0.3)
    assert decisions == []  # both joins are in before the term decides
    proposed = [conn for conn, frame in term.frames() if dicts_of(frame)[0]["t"] == "propose"]
    assert decisions == [0.3]
    assert sorted(proposed) == [10, 11]  # max_nodes is in: the round of three is proposed at once


def test_running_members_hear_when_nodes_start_waiting_not_of_every_join():
    term = _term(2, 5)
    _leader_joined(term)
    for conn, node in ((10, 2), (11, 3)):
        _connect(term, conn, node, 0.2)
        _join(term, conn, node, 0.3)
    term.handle_timer(1.5)  # the last call (1 s) ends: round 1 of three
    sent = _sent(term)
    assert [f["t"] for f in sent[10] if f["t"] == "round"] == ["round"]
    _connect(term, 12, 4, 1.6)
    _join(term, 12, 1, 1.6)  # a node waits for a place: the running members must restart
    sent = _sent(term)
    assert [s["waiting"] for s in _statuses(sent, 10)] == [1]
    assert [s["waiting"] for s in _statuses(sent, 11)] == [1]
    _connect(term, 13, 5, 1.7)
    _join(term, 13, 1, 1.7)  # a second one changes nothing they act on
    sent = _sent(term)
    assert _statuses(sent, 10) == _statuses(sent, 11) == []


def _rounds_formed(sent: dict[int, list[dict[str, Any]]]) -> set[tuple[str, ...]]:
    """The rounds formed (answered with ``round``), each by its members: the round itself, or
    the one proposed on that connection that it names."""
    formed = set()
    for frames in sent.values():
        proposed = {f["round"]["round"]: f["round"] for f in frames if f["t"] == "propose"}
        for f in frames:
            if f["t"] == "round":
                raw = f["round"] if "round" in f else proposed[f["number"]]
                formed.add(tuple(map(node_hex, Round.from_json(raw).members)))
    return formed


def test_a_last_round_member_that_gives_up_on_the_welcome_is_withdrawn_not_dropped():
    # A failover at scale: the new leader (rank 1 of the last round) is busy, one member gives
    # up waiting for it and says bye. It is alive: the round still waits for it, and when it
    # is back it joins at once, not held back as a node that was dropped.
    history = {"epoch": 0, "round": 4, "members": [f"{n:016x}" for n in (9, LEADER, 2, 3)]}
    term = _term(2, 8)
    term.book.rules = replace(term.book.rules, last_call_timeout_s=30.0)
    term.join_local(Join(1, "198.18.0.1", timeout_s=60.0, remaining_s=60.0), 0.1)
    _connect(term, 10, 2, 0.2)
    term.received(10, node_said([{"t": "bye"}]), 0.3)
    term.closed(10, "closed by the peer", 0.3)
    _connect(term, 11, 3, 0.4)
    term.received(11, node_said([{"t": "join", "id": 3, "ip": "198.18.0.3", "history": history}]), 0.5)
    _store_opened(term, 5002, 0.6)
    assert (
        2 not in term.book.ledger.lost and 2 not in term.book.ledger.drops and 2 not in term.book.ledger.gone
    )
    assert _rounds_formed(_sent(term)) == set()  # node 2, alive, is still expected (until the last call)
    _connect(term, 12, 2, 1.0)
    term.received(12, node_said([{"t": "join", "id": 2, "ip": "198.18.0.2", "history": history}]), 1.1)
    # The new leader takes rank 0; 3, whose rank 3 is past the end, takes the leader's old 1.
    assert _rounds_formed(_sent(term)) == {tuple(f"{n:016x}" for n in (LEADER, 3, 2))}


def test_a_join_read_in_the_same_batch_as_its_bye_is_withdrawn_not_put_in_a_round():
    # A node that gave up on a slow welcome (or moved to a rival claim) sent hello, join and bye
    # before the leader read any: the round this join would complete must not form with it,
    # or it would break at once (the node is lost with its connection) and hold the node back.
    history = {"epoch": 0, "round": 4, "members": [f"{n:016x}" for n in (9, LEADER, 2, 3)]}
    term = _term(2, 8)
    term.book.rules = replace(term.book.rules, last_call_timeout_s=30.0)
    _store_opened(term, 5001, 0.0)
    term.join_local(Join(1, "198.18.0.1", timeout_s=60.0, remaining_s=60.0), 0.1)
    _connect(term, 11, 3, 0.2)
    term.received(11, node_said([{"t": "join", "id": 3, "ip": "198.18.0.3", "history": history}]), 0.2)
    term.accepted(10, 0.3)
    hello = {"t": "hello", "node": f"{2:016x}", "epoch": 1, "leader": f"{LEADER:016x}", "ip": "198.18.0.2"}
    join = {"t": "join", "id": 2, "ip": "198.18.0.2", "history": history}
    term.received(10, node_said([hello, join, {"t": "bye"}]), 0.3)
    term.closed(10, "closed by the peer", 0.3)
    assert _rounds_formed(_sent(term)) == set()
    assert 2 not in term.book.ledger.lost and 2 not in term.book.ledger.drops
    _connect(term, 12, 2, 1.0)
    term.received(12, node_said([{"t": "join", "id": 4, "ip": "198.18.0.2", "history": history}]), 1.1)
    # The new leader takes rank 0; 3, whose rank 3 is past the end, takes the leader's old 1.
    assert _rounds_formed(_sent(term)) == {tuple(f"{n:016x}" for n in (LEADER, 3, 2))}


def test_a_member_of_the_running_round_that_says_bye_is_still_lost():
    term = _round_of_two()
    assert _rounds_formed(_sent(term))
    term.received(10, node_said([{"t": "bye"}]), 1.0)
    term.closed(10, "closed by the peer", 1.0)
    assert (
        2 in term.book.ledger.lost and 2 not in term.book.ledger.gone
    )  # lost (the round is stale), not gone
    assert term.book.stale


def test_a_new_term_is_established_by_a_majority_that_follows_it_now_not_by_every_hello_it_heard():
    # The new leader was in round 3 (5 members) of epoch 1; it counts itself. Support is kept
    # as members come and go: a member whose connection closed, or a node that reconnected
    # (its first connection superseded), is not counted twice.
    own = History(epoch=1, round=3, members=(LEADER, 2, 3, 4, 5))
    book = RoundBook(leader=LEADER, epoch=2, rules=RoundRules(2, 5, 1.0))
    term = LeaderTerm(
        claim=Claim(2, LEADER), book=book, advertised_ip="198.18.0.1", beats=Beats(1.0, 3.0),
        label="", own_history=own,
    )  # fmt: skip
    term.start(0.0)

    def hello(conn: int, node: int, last: dict[str, int] | None, now: float) -> None:
        term.accepted(conn, now)
        msg = {"t": "hello", "node": f"{node:016x}", "epoch": 2, "leader": f"{LEADER:016x}"}
        term.received(conn, node_said([{**msg, "ip": f"198.18.0.{node}", "last": last}]), now)

    round3 = {"epoch": 1, "round": 3, "size": 5}
    hello(10, 2, round3, 0.1)
    term.closed(10, "closed by the peer", 0.2)  # it left again: 1 of 5 (the leader)
    hello(11, 3, round3, 0.3)
    hello(12, 3, round3, 0.4)  # node 3 again, on a new connection: still 2 of 5
    hello(13, 6, {"epoch": 1, "round": 2, "size": 5}, 0.5)  # an older round supports nothing
    hello(14, 7, None, 0.6)
    assert not term.established
    hello(15, 4, round3, 0.7)  # 3 of 5: the leader, 3 and 4
    assert term.established


def _rounds_sent(sent: dict[int, list[dict[str, Any]]], conn: int) -> list[tuple[int, int]]:
    """(join, round number) of each round answer on ``conn`` (the round, or its number)."""
    frames = sent.get(conn, [])
    return [
        (f["id"], f["round"]["round"] if "round" in f else f["number"]) for f in frames if f["t"] == "round"
    ]


def test_a_member_whose_round_was_lost_with_its_connection_gets_it_again_and_is_not_lost():
    # Two claims of epoch 1 at start-up: node 2 joined us, moved to the rival as we sent it
    # round 1 (the frame went down the connection it closed), and came back with the same
    # join. It is a member of round 1: it gets the round again, and the round stays healthy
    # (our agent waits for its agent in the round's store).
    term = _round_of_two()
    assert _rounds_sent(_sent(term), 10) == [(7, 1)]
    term.closed(10, "connection reset by peer", 0.31)
    assert (term.book.stale, 2 in term.book.ledger.lost) == (True, True)  # lost, as far as we know
    _connect(term, 11, 2, 0.32)
    _join(term, 11, 7, 0.33)
    assert _rounds_sent(_sent(term), 11) == [(7, 1)]
    assert not term.book.stale and 2 not in term.book.ledger.lost and 2 not in term.book.ledger.drops
    assert term.book.current is not None and term.book.current.number == 1
    # A new join of that node (another ticket) is a re-join, as before.
    _join(term, 11, 8, 1.0)
    assert _rounds_sent(_sent(term), 11) == []
    assert 2 in term.book.pending


def test_a_lost_answer_is_not_sent_again_once_the_round_was_given_up():
    # As above, but our agent gave up on round 1 first (it joined again): round 1 is over for
    # everyone, so node 2's old join is a join of the next round, not round 1 again.
    term = _round_of_two()
    term.closed(10, "connection reset by peer", 0.31)
    term.join_local(Join(2, "198.18.0.1", timeout_s=60.0, remaining_s=60.0), 0.32)
    _connect(term, 11, 2, 0.33)
    _join(term, 11, 7, 0.34)
    assert _rounds_sent(_sent(term), 11) == []
    assert {1, 2} <= term.book.pending.keys() and term.book.stale  # both wait for round 2


def test_a_member_whose_new_connection_came_first_gets_its_round_again_and_keeps_its_drop_count():
    # The new connection's hello superseded the old one before its close was seen: the node
    # was never counted lost, and an earlier drop of it in this term still counts.
    term = _round_of_two()
    term.book.ledger.drops[2] = 1
    _connect(term, 11, 2, 0.31)
    term.closed(10, "connection reset by peer", 0.32)
    _join(term, 11, 7, 0.33)
    assert _rounds_sent(_sent(term), 11) == [(7, 1)]
    assert term.book.ledger.drops == {2: 1} and not term.book.stale


def test_a_new_process_of_a_member_breaks_its_round_and_does_not_get_it_for_its_first_ticket():
    # Node 2's agent died and a new one took its id (``_identity``), one incarnation later,
    # before the old connection was seen to close. Its tickets count from 1 again: its join 7
    # is a new join, not the one round 1 answered, and its old process's round is broken.
    term = _round_of_two()
    _sent(term)
    term.accepted(11, 0.31)
    hello = {"t": "hello", "node": f"{2:016x}", "epoch": 1, "leader": f"{LEADER:016x}", "ip": "198.18.0.2"}
    term.received(11, node_said([{**hello, "inc": 2, "ahead": True}]), 0.31)
    assert term.book.stale and "a new process of the node started" in term.book.ledger.lost_why[2]
    _join(term, 11, 7, 0.33)
    assert _rounds_sent(_sent(term), 11) == []
    assert 2 in term.book.pending


def _proposed(term: LeaderTerm) -> list[tuple[int, dict[str, Any]]]:
    """The proposals the term sent (and what else it sent, dropped); the leader's own node
    accepts each at once."""
    for answer in term.local():
        if isinstance(answer, Propose):
            term.accept_local(answer.round.number, term._now)
    out: list[tuple[int, dict[str, Any]]] = []
    for conn, frame in term.frames():
        frames = dicts_of(frame)
        assert isinstance(frames, list)
        out.extend((conn, f) for f in frames if f["t"] == "propose")
    return out


def _base_of_three() -> LeaderTerm:
    """A new term whose joiners (the leader, nodes 2 and 3) ran round 4 of nodes 1 to 3."""
    book = RoundBook(leader=LEADER, epoch=2, rules=RoundRules(2, 4, 1.0))
    term = LeaderTerm(
        claim=Claim(2, LEADER),
        book=book,
        advertised_ip="198.18.0.1",
        beats=Beats(1.0, 3.0),
        label="",
    )
    term.start(0.0)
    term.jobs()
    _store_opened(term, 5001, 0.1)
    last = History(epoch=1, round=4, members=(1, 2, 3))
    term.join_local(Join(1, "198.18.0.1", history=last, timeout_s=60.0, remaining_s=60.0), 0.1)
    for node, conn in ((2, 10), (3, 11)):
        term.accepted(conn, 0.2)
        hello = {"t": "hello", "node": f"{node:016x}", "epoch": 2, "leader": f"{LEADER:016x}", "ip": "x"}
        term.received(conn, node_said([hello]), 0.2)
        join = {"t": "join", "id": 7, "ip": f"198.18.0.{node}", "timeout": 60, "remaining": 60}
        term.received(conn, node_said([{**join, "history": last.to_json()}]), 0.3)
    return term


def test_a_proposal_stands_when_a_node_joins_during_it_and_the_node_waits_for_the_next_round():
    term = _base_of_three()
    term.handle_timer(1.5)  # the last call ends: round 5 of nodes 1 to 3 is proposed
    (first, *_) = _proposed(term)
    number = first[1]["round"]["round"]
    term.accepted(12, 1.6)  # node 4 (a spare) joins while the votes are on their way
    hello = {"t": "hello", "node": f"{4:016x}", "epoch": 2, "leader": f"{LEADER:016x}", "ip": "198.18.0.4"}
    term.received(12, node_said([hello]), 1.6)
    term.received(
        12, node_said([{"t": "join", "id": 1, "ip": "198.18.0.4", "timeout": 60, "remaining": 60}]), 1.6
    )
    assert _proposed(term) == [] and term.vote.current is not None
    assert term.vote.current.round.number == number  # the same proposal: not sent again to everyone
    for conn in (10, 11):
        term.received(conn, node_said([{"t": "accept", "round": number, "ok": True}]), 1.7)
    assert term.book.current is not None and term.book.current.number == number
    assert 4 in term.book.pending and 4 not in term.book.current.member_set


def test_a_refusal_of_a_proposal_given_up_since_does_not_withdraw_the_current_one():
    term = _base_of_three()
    term.handle_timer(1.5)
    number = _proposed(term)[0][1]["round"]["round"]
    refusal = {"t": "accept", "round": number - 1, "ok": False, "history": None, "accepted": None}
    term.received(10, node_said([refusal]), 1.6)
    assert term.vote.current is not None and term.vote.current.round.number == number
    assert _proposed(term) == []


def test_the_next_rounds_store_opens_a_moment_after_a_round_and_at_once_when_a_round_wants_it():
    """A thousand members connecting to the next store must not compete with the new round's
    start: it opens NEXT_STORE_DELAY_S after the round; a round wanted sooner does not wait."""
    term = _round_of_two()  # round 1 formed at 0.3
    assert term.jobs() == []  # not yet
    term.handle_timer(0.3 + NEXT_STORE_DELAY_S / 2)
    assert term.jobs() == []
    next_timer = term.next_timer()
    assert next_timer is not None and next_timer <= 0.3 + NEXT_STORE_DELAY_S
    term.handle_timer(0.3 + NEXT_STORE_DELAY_S)
    assert term.jobs() == [OpenStore()]

    term = _round_of_two()
    term.received(
        10, node_said([{"t": "leave"}]), 0.4
    )  # node 2 leaves (its vote with it): the round is stale
    term.join_local(
        Join(2, "198.18.0.1", timeout_s=60.0, remaining_s=60.0), 0.5
    )  # the leader re-joins alone (min 2: it waits)
    _connect(term, 11, 3, 0.6)
    _join(term, 11, 9, 0.7)  # a new round is due now: its store opens at once
    assert term.jobs() == [OpenStore()]


def _run_timers(term: LeaderTerm, start: float, until: float, every_s: float | None = None) -> list[float]:
    """Drive the term's timers as the loop does, from ``start`` to ``until``; with ``every_s``,
    node 2 (connection 10) sends a heartbeat that often. Returns the times the term woke."""
    woke: list[float] = []
    t, next_hb = start, start + (every_s or 0.0)
    while True:
        timer = term.next_timer()
        assert timer is not None
        t = min(timer, next_hb) if every_s else timer
        if t > until:
            return woke
        if every_s and t == next_hb:
            term.received(10, node_said([{"t": "hb"}]), t)
            next_hb += every_s
        if t >= timer:
            term.handle_timer(t)
            woke.append(t)
        if any(f["t"] == "evicted" for f in _sent(term).get(10, [])):
            return woke


def test_a_silent_member_is_dropped_when_its_heartbeat_bound_ends_not_at_the_next_beat():
    term = _round_of_two()  # node 2 last heard at 0.3; heartbeats every 1 s, bound 3 s
    woke = _run_timers(term, 0.3, 10.0)
    assert woke[-1] == 0.3 + 3.0  # it used to be the beat after: 4.0


def test_bytes_that_complete_no_frame_do_not_keep_a_member():
    """Only a whole frame counts: part of one (a header, a byte now and then) proves nothing,
    and with a secret it is not authenticated yet."""
    term = _round_of_two()  # node 2 last heard at 0.3; bound 3 s
    for t in (1.0, 2.0, 3.0):
        term.received(10, node_said([]), t)
    woke = _run_timers(term, 3.0, 20.0)  # runs until node 2 is evicted (or 20 s)
    assert woke[-1] == 0.3 + 3.0, woke


def test_members_that_keep_beating_cost_the_leader_no_wake_up_beside_its_beats():
    term = _round_of_two()
    woke = _run_timers(term, 0.3, 10.3, every_s=1.0)
    beats = [t for t in woke if abs(t - round(t)) < 1e-9]
    assert len(woke) - len(beats) <= 1, woke  # the next round's store, opened once
    assert not any(f["t"] == "evicted" for f in _sent(term).get(10, []))


def test_a_proposal_never_forms_with_a_member_whose_join_timed_out_while_the_votes_came_in():
    """Node 3's agent gives up (its join is answered "timeout") while round 5 waits for node 2's
    vote; only heartbeats and accepts arrive meanwhile. The round must not form with node 3 in
    it: its agent raised, and the others would wait for it in the store."""
    book = RoundBook(leader=LEADER, epoch=2, rules=RoundRules(2, 4, 1.0))
    term = LeaderTerm(
        claim=Claim(2, LEADER),
        book=book,
        advertised_ip="198.18.0.1",
        beats=Beats(interval_s=1.0, timeout_s=30.0),
        label="",
    )
    term.start(0.0)
    term.jobs()
    _store_opened(term, 5001, 0.1)
    last = History(epoch=1, round=4, members=(1, 2, 3))
    term.join_local(Join(1, "198.18.0.1", history=last, timeout_s=60.0, remaining_s=60.0), 0.1)
    for node, conn, remaining in ((2, 10, 60), (3, 11, 2)):
        term.accepted(conn, 0.2)
        hello = {"t": "hello", "node": f"{node:016x}", "epoch": 2, "leader": f"{LEADER:016x}", "ip": "x"}
        term.received(conn, node_said([hello]), 0.2)
        join = {"t": "join", "id": 7, "ip": f"198.18.0.{node}", "timeout_s": remaining}
        join["remaining_s"] = remaining
        term.received(conn, node_said([{**join, "history": last.to_json()}]), 0.3)
    term.handle_timer(1.5)  # round 5 of nodes 1 to 3 is proposed; the leader's node accepts
    number = _proposed(term)[0][1]["round"]["round"]
    t = 1.6
    while not any(f["t"] == "timeout" for f in _sent(term).get(11, [])):
        assert t < 10.0, "node 3's join never timed out"
        term.received(10, node_said([{"t": "hb"}]), t)
        term.received(11, node_said([{"t": "hb"}]), t)
        term.handle_timer(t)
        t += 0.5
    term.received(10, node_said([{"t": "accept", "round": number, "ok": True}]), t)
    rnd = term.book.current
    assert rnd is None or 3 not in rnd.member_set, f"round {rnd} formed with node 3, whose join timed out"


def test_a_join_naming_its_round_by_number_gets_its_members_and_an_unknown_one_loses_its_connection():
    """A member's join names a round answered on its connection by number (``ref``): the
    leader holds its members; another number is a broken peer, which loses its connection."""
    term = _round_of_two()
    rnd = term.book.current
    assert rnd is not None
    term.received(10, node_said([{"t": "join", "id": 8, "ip": "x", "ref": rnd.number, "history": None}]), 1.0)
    assert term.book.pending[2].history == History.of(rnd)
    term.received(
        10, node_said([{"t": "join", "id": 9, "ip": "x", "ref": rnd.number + 1, "history": None}]), 1.1
    )
    assert [conn for conn, _ in term.closes()] == [10]


def test_a_rounds_frame_for_every_member_is_one_object_that_the_term_hands_out_to_each():
    """A round's ``propose`` (and, without a quorum, its ``members``) frame holds every member:
    encoded once, and the same ``bytes`` object handed out for each connection (the loop
    queues it as it is: ``_outbox.Outbox``), never a copy per member."""
    for quorum, kind in ((True, "propose"), (False, "members")):
        term = _term(4, 4)
        term.book.rules = replace(term.book.rules, quorum=quorum)
        _leader_joined(term)
        for node, conn in enumerate((10, 11, 12), start=2):
            _connect(term, conn, node, 0.2)
            _join(term, conn, 7, 0.3)
        big = [(conn, f) for conn, f in term.frames() if dicts_of(f)[0]["t"] == kind]
        assert [conn for conn, _ in big] == [10, 11, 12], kind
        assert all(f is big[0][1] for _, f in big), kind


@pytest.mark.parametrize("batches", [1, 8])
def test_the_frames_a_first_round_costs_per_member_do_not_grow_with_the_round(batches):
    """Control frames per join are a constant of the protocol (bench-scale's frames/join
    target): welcome, next, propose and round out, whatever N and however the joins batch."""
    per_member = {}
    for n in (16, 256):
        term = _term(n, n)
        _leader_joined(term)
        for node in range(2, n + 1):
            _connect(term, 100 + node, node, 0.2)
        kinds: Counter[str] = Counter()
        nodes = list(range(2, n + 1))
        for b in range(batches):
            for node in nodes[b::batches]:
                _join(term, 100 + node, node, 0.3 + b * 0.01)
            for frames in _sent(term).values():
                kinds.update(f["t"] for f in frames)
        for frames in _sent(term).values():
            kinds.update(f["t"] for f in frames)
        assert kinds["round"] == n - 1, kinds
        per_member[n] = {kind: count / (n - 1) for kind, count in kinds.items()}
    assert per_member[16] == per_member[256] == {"welcome": 1, "next": 1, "propose": 1, "round": 1}


def test_a_flood_of_connections_that_say_no_hello_never_keeps_a_node_out():
    """A host without the secret opens connections and says nothing (reopening each one the
    hello deadline closes): at the cap, a connection from another host makes the flooder's
    oldest give way; the flooder's own new ones are refused."""
    term = _term(1, 4)
    _leader_joined(term)
    flood = [100 + i for i in range(MAX_UNIDENTIFIED + 500)]
    for conn in flood:
        term.accepted(conn, 0.2, "198.18.0.66")
    closed = {conn for conn, _why in term.closes()}
    assert closed == set(flood[MAX_UNIDENTIFIED:])  # its own new ones: first come, first served
    term.accepted(10, 0.3, "198.18.0.2")  # another host's: the flooder's oldest gives way
    for conn in range(5000, 5000 + MAX_UNIDENTIFIED):  # the storm goes on while it says hello
        term.accepted(conn, 0.3, "198.18.0.66")
    _hello(term, 10, 2, 0.3)
    assert 10 in term.conns and term.follows(2)
    assert all(conn != 10 for conn, _why in term.closes())
    waiting = sum(1 for m in term.conns.values() if m.node is None)
    assert waiting == MAX_UNIDENTIFIED - 1  # bounded whatever the storm (node 2 said hello)


def test_a_node_that_leaves_for_a_job_that_ran_says_so_and_the_leader_founds_no_job_alone():
    """Seed 23493: a follower left for a leader whose job ran; its bye said nothing, and the
    leader it left founded a job of one. Its bye says the round it heard of now."""
    term = _term(1, 4)
    _connect(term, 10, 2, 0.1)
    term.received(10, node_said([{"t": "bye", "seen": [[1, "0b", 2]]}]), 0.2)
    assert term.book.others.heard.keys == ((1, 0xB, 2),)
    _leader_joined(term)
    d = term.book.decide(100.0)
    assert isinstance(d, Wait) and "round 2 of this job (epoch 1, leader 000000000000000b) ran" in d.reason


def test_a_join_naming_a_round_never_answered_here_costs_the_node_its_connection_and_our_own_error_is_ours(
    monkeypatch: pytest.MonkeyPatch,
):
    """The peer's fault is the peer's (its connection ends as a protocol error); an error of the
    leader's own code is not blamed on whichever peer's frame reached it: it leaves the term, for
    the shell's supervision (``Node.recover``: the leader resigns)."""
    term = _term(1, 4)
    _connect(term, 10, 2, 0.1)
    term.received(10, node_said([{"t": "join", "id": 1, "ip": "198.18.0.2", "ref": 9}]), 0.2)
    ((conn, why),) = term.closes()
    assert conn == 10 and "round 9, which was not answered on this connection" in why
    _connect(term, 11, 3, 0.3)

    def broken(self: RoundBook, *args: object) -> None:
        raise TypeError("a bug of the leader's own")

    monkeypatch.setattr(RoundBook, "join", broken)
    with pytest.raises(TypeError, match="a bug of the leader's own"):
        term.received(11, node_said([{"t": "join", "id": 1, "ip": "198.18.0.3"}]), 0.4)
    assert 11 in term.conns


def test_a_join_sent_on_a_connection_its_node_no_longer_uses_never_withdraws_its_later_join():
    """Seed 10029097 of the 2 h run at 124d168: a node's join on its first connection (its
    deadline at 10.3 s) stayed in the term's deadline heap after that connection closed; the
    node joined again on a new one (deadline at 66 s), and at 10.3 s the old deadline withdrew
    the node's new join: a fixed-size job waited for it until its agent gave up."""
    term = _term(3, 3)
    _leader_joined(term)
    _connect(term, 10, 2, 0.2)
    term.received(10, node_said([{"t": "join", "id": 1, "ip": "x", "timeout_s": 10, "remaining_s": 10}]), 0.3)
    term.closed(10, "closed by the peer", 1.0)
    _connect(term, 11, 2, 5.0)
    term.received(11, node_said([{"t": "join", "id": 2, "ip": "x", "timeout_s": 60, "remaining_s": 60}]), 6.0)
    for beat in (8.0, 10.0):
        term.received(11, node_said([{"t": "hb"}]), beat)
        term.handle_timer(beat)
    term.handle_timer(10.5)
    assert 2 in term.book.pending, "the old connection's deadline withdrew the node's new join"
    assert not any(f["t"] == "timeout" for f in _sent(term).get(11, []))


def test_a_member_that_heard_of_another_sides_round_while_a_proposal_was_out_stops_it():
    """Seed 50005902: a member heard of another side's first round after its join went out; it
    tells its leader at once (a beat with ``seen``, before its vote), and the proposal it has
    to account for is given up: the round waits for a member of that side."""
    term = _base_of_three()
    term.handle_timer(1.5)
    number = _proposed(term)[0][1]["round"]["round"]
    # Numbered as the proposal: not older than its base.
    term.received(10, node_said([{"t": "hb", "seen": [[2, "0b", 5]]}]), 1.6)
    assert term.vote.current is None
    for conn in (10, 11):  # the votes come after the news: nothing forms
        term.received(conn, node_said([{"t": "accept", "round": number, "ok": True}]), 1.7)
    assert term.book.current is None or term.book.current.number != number
    d = term.book.decide(1.8)
    assert isinstance(d, Wait) and "round 5 of this job (epoch 2, leader 000000000000000b) ran" in d.reason


def test_a_beat_with_nothing_new_leaves_the_proposal_as_it_is():
    term = _base_of_three()
    term.handle_timer(1.5)
    number = _proposed(term)[0][1]["round"]["round"]
    term.received(10, node_said([{"t": "hb", "seen": [[1, f"{LEADER:x}", 4]]}]), 1.6)  # the base: known
    term.received(11, node_said([{"t": "hb"}]), 1.6)
    assert term.vote.current is not None and term.vote.current.round.number == number
