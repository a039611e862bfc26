"""A leader's joins: each member's join, its answer, its deadline, and whether it is parked.

A join is answered once (``answer``): the round it is in, a wait, a retry, a timeout or the
job's close; the leader's own node gets the same records without a connection. A join's
deadline is its ``remaining_s`` (what is left of its agent's ``join_timeout``), kept in one
heap; a parked join (a healthy round runs without it: a spare, or a returning node held
back) waits for the job, not for a timeout, and its wait starts again when it is unparked
(``update_parking``). A node that will likely be in the next round is told that round's store
once it is open (``offer_spare``): it connects ahead, and the round costs its agent no connect.
"""

from __future__ import annotations

import heapq
import logging
from typing import Any, Protocol

from torch_mingle._frames import (
    JobClosed,
    Join,
    JoinAnswer,
    JoinTimedOut,
    LeaderFrame,
    Members,
    Next,
    OutOfContext,
    Retry,
    RoundFormed,
    Wait,
)
from torch_mingle._member import ConnId, Member
from torch_mingle._ports import StorePorts
from torch_mingle._proposals import Vote
from torch_mingle._records import History, JobEnd, Round, keep_delivered, node_hex
from torch_mingle._rounds import JoinRequest, RoundBook
from torch_mingle._wire import frame_digest

log = logging.getLogger(__name__)


class Desk(Protocol):
    """What the joins read of their term and ask of it (``_leader.LeaderTerm``)."""

    book: RoundBook
    conns: dict[ConnId, Member]
    label: str
    seal_key: bytes | None
    ports: StorePorts
    vote: Vote
    ended: JobEnd | None
    _self: Member | None
    _by_node: dict[int, Member]
    _local: list[Any]
    _offer_after_decide: list[Member]

    @property
    def counters(self) -> Any: ...
    def _decide(self, now: float) -> None: ...
    def _mark_status(self, now: float) -> None: ...
    def _out(self, m: Member, frame: bytes, digest: bytes | None = None) -> None: ...
    def _send_record(self, m: Member, frame: LeaderFrame) -> None: ...
    def _set_last(self, m: Member, last: tuple[int, int, int] | None) -> None: ...
    def _update_established(self) -> None: ...


class JoinDesk:
    def __init__(self) -> None:
        #: A heap of join deadlines: (when, order, member); an entry whose member's deadline
        #: moved since is stale.
        self.deadlines: list[tuple[float, int, Member]] = []
        self._seq = 0
        #: The round's state at the last parking pass, and the joins since: with the round
        #: unchanged, only they are looked at (a pass per join would make a round O(N**2)).
        self._parking_state: tuple[object, ...] = ()
        self.joined_since_parking: list[Member] = []
        #: The last formed round's ``members`` frame (``send_members``), and its digest.
        self._members_frame: tuple[Round, bytes, bytes | None] | None = None

    def next_deadline(self) -> float | None:
        """The earliest join deadline that still stands."""
        deadlines = self.deadlines
        while deadlines and deadlines[0][2].join_deadline != deadlines[0][0]:
            heapq.heappop(deadlines)  # that join was answered or its deadline moved
        return deadlines[0][0] if deadlines else None

    def asked(self, term: Desk, m: Member, join: Join, now: float) -> None:
        """A join, from a member's connection or from the leader's own node."""
        assert m.node is not None  # noqa: S101 - only identified members join
        req = JoinRequest(m.node, join, self.history_of(term, m, join), m.incarnation)
        self.join(term, m, join.ticket, req, join.timeout_s, join.remaining_s, now)

    def history_of(self, term: Desk, m: Member, join: Join) -> History | None:
        """A join's last round: sent whole, or (``ref``) by the number of a round answered on
        this connection (``Member.delivered``); any other number is a protocol error."""
        if join.ref is None:
            return join.history
        rnd = m.delivered.get(join.ref)
        if rnd is None:  # the follower names only what it got here: a broken peer
            raise OutOfContext(f"its join names round {join.ref}, which was not answered on this connection")
        # A History of its own per join, as a parsed one is (the round book tells joins
        # apart by identity), sharing the round's members and their set: O(1) a join.
        return History.of(rnd)

    def join(
        self,
        term: Desk,
        m: Member,
        ticket: int,
        req: JoinRequest,
        timeout_s: float,
        remaining_s: float,
        now: float,
    ) -> None:
        """A join; ``timeout_s`` is the node's ``join_timeout``, ``remaining_s`` what is left of it."""
        node = m.node
        assert node is not None  # noqa: S101 - only identified members join
        if ticket in (m.answered, m.join_id):
            return  # the same request again: it was (or will be) answered once
        if m.join_id is not None:
            self.answer(term, m, Retry, why="superseded by a newer join of the same node")
        term.counters.joins += 1
        rnd = term.book.current
        if (
            rnd is not None
            and term.vote.delivered.get(node) == (m.incarnation, ticket)
            and term.book.may_resend(node)
        ):
            # The join this round answered, again, on a new connection: the node closed the
            # old one as the round was sent (it moved to a rival claim of the same epoch and
            # back). It is a member: it gets the round again and is not lost, or the others'
            # agents would wait for it in the round's store (torch's 300 s). Not once another
            # member broke the round or joined again: then it joins the next round.
            log.info(
                "%s node %s asked again for round %d: sent again", term.label, node_hex(node), rnd.number
            )
            term.book.revive(node)
            m.join_id = ticket
            self.send_members(term, m, rnd)
            self.answer(term, m, RoundFormed, round=rnd)
            term._mark_status(now)
            return
        m.join_id = ticket
        m.join_timeout_s = timeout_s
        self.set_deadline(term, m, now + remaining_s if remaining_s > 0 else None)
        m.parked = False
        self.joined_since_parking.append(m)
        history = req.history
        if history is not None and history.has(node):
            term._set_last(m, (history.epoch, history.round, len(history.members)))
        if term.book.closed:
            self.answer(term, m, JobClosed, end=term.ended or JobEnd())
            return
        term.book.join(req, now)
        term._offer_after_decide.append(m)
        term._update_established()

    def answer(
        self, term: Desk, m: Member, kind: type[JoinAnswer], *, status_text: str | None = None, **fields: Any
    ) -> None:
        """Answer a member's join with a ``kind`` of ``fields`` (``status_text``: the status a
        round runs under, as JSON text encoded once for all its members)."""
        ticket = m.join_id if m.join_id is not None else 0
        if kind is not Wait:
            m.answered = m.join_id
            m.join_id = None
            self.set_deadline(term, m, None)
            m.parked = None
        answer = kind(ticket, **fields)
        if m.conn is None:
            term._local.append(answer)
        elif isinstance(answer, RoundFormed):  # by number: the member holds it (proposed, or ``members``)
            rnd = answer.round
            assert rnd is not None  # noqa: S101 - the leader answers with the round itself
            keep_delivered(m.delivered, rnd)  # as the follower records it (``_delivered_number``)
            term._out(m, RoundFormed(ticket, number=rnd.number).encode(status_text))
        else:
            term._send_record(m, answer)

    def send_members(self, term: Desk, m: Member, rnd: Round) -> None:
        """The formed round ``rnd`` to a member that did not get it as a proposal; the answer
        that follows names it by number. Encoded once per round, the same bytes for every
        member (one frame of N members built per member made a round O(N**2) in the leader)."""
        cached = self._members_frame
        if cached is None or cached[0] is not rnd:
            frame = Members(rnd).encode()
            digest = frame_digest(frame) if term.seal_key is not None else None
            cached = self._members_frame = (rnd, frame, digest)
        term._out(m, cached[1], cached[2])

    def update_parking(self, term: Desk, now: float) -> None:
        # Parking depends on the round only (whether it runs, ``RoundBook.runs``) and on who
        # joined since: a pass over every member per join would make a round of N joins O(N**2).
        state = (term.book.current, term.book.runs())
        changed = self.members(term) if state != self._parking_state else self.joined_since_parking
        self._parking_state, self.joined_since_parking = state, []
        for m in changed:
            dropped = m.conn is not None and term.conns.get(m.conn) is not m
            if m.join_id is None or m.node is None or dropped:
                continue  # answered, superseded or dropped since it joined
            parked = term.book.parked(m.node)
            if parked == m.parked:
                continue
            if parked:
                self.set_deadline(term, m, None)  # it waits for the job, not for a timeout
            elif m.parked and m.join_timeout_s > 0:
                self.set_deadline(term, m, now + m.join_timeout_s)  # its wait for a round starts now
            m.parked = parked
            self.answer(
                term,
                m,
                Wait,
                parked=parked,
                reason=term.book.explain(),
                seen=term.book.highest_heard(),
                cause=term.book.wait_kind,
            )
            if not parked:
                self.offer_spare(term, m)

    def check_joins(self, term: Desk, now: float) -> None:
        due, withdrawn = [], False
        while self.deadlines and self.deadlines[0][0] <= now:
            deadline, _, m = heapq.heappop(self.deadlines)
            if m.join_deadline == deadline:
                due.append(m)
        for m in due:
            if m.node is None or m.join_id is None:
                continue
            if m is not term._self and term._by_node.get(m.node) is not m:
                continue  # a connection its node no longer uses: its join is not the node's now
            if term.book.parked(m.node):
                self.set_deadline(term, m, None)
                continue
            why = term.book.explain()
            term.book.withdraw(m.node)
            self.answer(term, m, JoinTimedOut, why=why)
            withdrawn = True
        term._mark_status(now)
        if withdrawn:
            # A proposal out with this node in it must not form without it (its agent gave up):
            # decide again now, not at the next batch that decides (during a vote, heartbeats
            # and accepts decide nothing).
            term._decide(now)

    def set_deadline(self, term: Desk, m: Member, deadline: float | None) -> None:
        m.join_deadline = deadline
        if deadline is not None:
            self._seq += 1
            heapq.heappush(self.deadlines, (deadline, self._seq, m))
            if len(self.deadlines) > 4 * (len(term._by_node) + 16):  # mostly answered joins: rebuild
                self.deadlines = [e for e in self.deadlines if e[2].join_deadline == e[0]]
                heapq.heapify(self.deadlines)

    def members(self, term: Desk) -> list[Member]:
        out = list(term._by_node.values())
        if term._self is not None:
            out.append(term._self)
        return out

    def may_join_next(self, term: Desk, m: Member) -> bool:
        """A node whose agent will likely be in the next round: its join waits, unparked, or it
        runs in the current round (which the next one replaces after a failure or a change)."""
        if m.parked:
            return False
        if m.join_id is not None:
            return True
        book, node = term.book, m.node
        return (
            book.current is not None
            and node in book.current.member_set
            and book.ledger.live(node)
            and node not in book.arrived  # in torch's exit barrier: its job is done
        )

    def offer_spare(self, term: Desk, m: Member) -> None:
        """Name the next round's store to a node that waits for a round or runs in the current
        one: it connects to it ahead of time, so the next round costs its agent no connect
        (followers only: the leader's own agent reads ``spare_port``)."""
        port = term.ports.spare
        if port is not None and m.conn is not None and m.connects_ahead and m.offered != port:
            m.offered = port
            term._send_record(m, Next(port))
