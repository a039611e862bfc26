"""The agent's join (``next_rendezvous``): its ticket, where it goes, what the leader answers,
and until when it waits.

A join goes to the term this node leads (the same ``Join`` record, without a connection) or
to the leader it follows; without either it waits for one (``Node`` sends it once it has
one). Its answer is handed to the agent's thread only after the snapshot that shows it
(``hand_over``): whatever the thread reads once it has the answer is at least as new. Its
deadline restarts at the end of each park (a spare waits for the job, not for a timeout:
docs/faults.md), and the node's own deadline ends ``JOIN_GRACE_S`` after the leader's, for a
leader that stopped answering without dropping the session.
"""

from __future__ import annotations

import logging
from typing import Protocol

from torch_mingle._ballot import Ballot
from torch_mingle._errors import StateError
from torch_mingle._follower import FollowerSession
from torch_mingle._frames import JobClosed, Join, JoinAnswer, JoinTimedOut, Retry, RoundFormed, Wait
from torch_mingle._keys import RoundKey
from torch_mingle._leader import LeaderTerm
from torch_mingle._protocol import Discovery
from torch_mingle._ready import Routes, Ticket
from torch_mingle._record import assert_never, replace
from torch_mingle._records import Heard, JobEnd, Round, Status, WaitKind
from torch_mingle._settings import NodeSettings
from torch_mingle._view import JobOver, Misconfigured, TimedOut

log = logging.getLogger(__name__)

#: The leader answers a join's timeout itself (with the reason); the node's own deadline
#: fires this much later, for a leader that stopped answering without dropping the session.
JOIN_GRACE_S = 2.0


class Joiner(Protocol):
    """What a join reads of its node and asks of it (``_node.Node``)."""

    settings: NodeSettings
    core: Discovery
    ballot: Ballot
    routes: Routes
    in_round: Round | None
    job_closed: bool
    saw_open: bool
    #: Leaders of its last round that left the job, with the round they left.
    gone: dict[int, RoundKey]
    joining: Joining

    @property
    def label(self) -> str: ...
    @property
    def term(self) -> LeaderTerm | None: ...
    @property
    def leading(self) -> LeaderTerm | None: ...
    @property
    def session(self) -> FollowerSession | None: ...
    def heard(self) -> Heard: ...
    def status(self, now: float) -> Status | None: ...
    def resolve(self, ticket: Ticket, result: object = None, error: BaseException | None = None) -> None: ...
    def extend(self, ticket: Ticket, due: float | None) -> None: ...
    def joined(self, rnd: Round, session: FollowerSession | None) -> None: ...
    def job_closed_seen(self, end: JobEnd) -> None: ...


class Joining:
    def __init__(self) -> None:
        self.ticket: Ticket | None = None
        #: The answer to ``ticket``, handed over at the end of the flush, after the snapshot
        #: that shows it (``hand_over``).
        self.answered: object = None
        #: The leader said a healthy round runs without this node (a spare, or held off).
        self.parked = False
        #: How often it was parked: a wait restarts at the end of each (docs/faults.md).
        self.parks = 0
        #: The last reason the leader gave for this node's wait (its "wait" answer).
        self.wait_reason = ""
        self.wait_kind = WaitKind.FIRST_JOIN
        #: Why the job's leader refused this node's settings ("": it did not): every join fails.
        self.refused = ""

    def open(self) -> Ticket | None:
        """The agent's join, while it waits for an answer the node has not decided yet."""
        join = self.ticket
        return join if join is not None and not join.decided and self.answered is None else None

    def decided(self, result: object) -> None:
        """The join's answer, handed over by ``hand_over`` once the snapshot shows it."""
        if self.open() is not None:
            self.answered = result

    def hand_over(self, node: Joiner) -> None:
        """Give the agent's thread the join's answer, after the snapshot of the state it
        comes from: the thread then never reads a snapshot older than its round (the round
        would look over, and its rank keys would be stood in for: ``AgentStore``)."""
        join, answer = self.ticket, self.answered
        if join is not None and answer is not None:
            self.answered = None
            node.resolve(join, result=answer)

    def asked(self, node: Joiner, ticket: Ticket, now: float) -> None:
        """The agent asks for a place in the next round; a join that still waits gives way."""
        superseded = self.open()
        if superseded is not None:
            node.resolve(superseded, error=StateError("superseded by a newer join"))
        self.ticket, self.answered = ticket, None
        self.parked = False
        self.set_due(node, ticket, now + ticket.timeout_s)
        if self.refused:
            self.decided(Misconfigured(self.refused))
        elif node.job_closed:
            self.closed(node, JobEnd("the job was already closed"), now)
        else:
            self.send(node, now)

    def refuse(self, why: str) -> None:
        """The job's leader refused this node's settings: the join that waits fails, and every
        later one at once."""
        self.refused = why
        self.decided(Misconfigured(why))

    def give_up(self, node: Joiner, why: str) -> None:
        """The node leaves or shuts down: the join that waits fails with ``why``."""
        if self.ticket is not None:
            node.resolve(self.ticket, error=StateError(why))

    def set_due(self, node: Joiner, ticket: Ticket, expires: float | None) -> None:
        node.extend(ticket, None if expires is None else expires + JOIN_GRACE_S)

    def remember_heard(self, node: Joiner) -> None:
        """What this node heard of the job, on the disk while a round may count it without its
        vote (``Ballot.remember``): before its join goes out, and whenever it hears more while
        the join waits (a spare is taken in on the join it sent before the job's first round)."""
        if self.open() is not None:
            node.ballot.remember(node.heard())

    def send(self, node: Joiner, now: float) -> None:
        """The join goes out: to this node's own term, or to the leader it follows."""
        join = self.open()
        if join is None:
            return
        self.remember_heard(node)  # on the disk before the join goes out
        remaining = join.timeout_s if join.due is None else max(0.001, join.due - now - JOIN_GRACE_S)
        term, session = node.leading, node.session
        if term is not None:
            session = None  # its own term's join: the same record, without a connection
            ip = towards = node.settings.advertised_ip
        elif session is not None:
            ip, towards = session.own_ip, session.ip
        else:
            return
        ask = Join(
            ticket=join.id,
            ip=ip,
            history=node.ballot.history,
            accepted=node.ballot.accepted,
            earlier=node.ballot.told(),
            timeout_s=join.timeout_s,
            remaining_s=remaining,
            dport=node.routes.discovery_port_towards(towards),
            pport=node.settings.probe_port,
            gone=tuple(node.gone.items()),
            place=node.settings.place,
            restarted=node.settings.incarnation > 1 and node.in_round is None,
            seen=node.heard(),
        )
        if term is not None:
            term.join_local(ask, now)
        elif session is not None:
            session.join(ask)

    def answer(self, node: Joiner, answer: JoinAnswer, session: FollowerSession | None, now: float) -> None:
        """The leader's answer to the agent's join (its own term's, or by ``session``)."""
        join = self.open()
        if join is None or (not isinstance(answer, JobClosed) and join.id != answer.ticket):
            return  # an answer to an older request
        match answer:
            case RoundFormed(round=Round() as rnd):
                node.joined(rnd, session)
            case RoundFormed():
                raise StateError(f"{node.label} a round answer without its round")
            case Retry():
                log.info("%s asked to join again: %s", node.label, answer.why)
                self.send(node, now)
            case JoinTimedOut():
                if session is not None:
                    who = f"the leader is {session.ip} ({session.claim})"
                else:
                    who = f"this node leads ({node.term.claim})" if node.term is not None else "this node led"
                self.decided(TimedOut(f"{who}; {answer.why}"))
            case JobClosed(end=end):
                node.job_closed_seen(
                    end if end.why else replace(end, why="the job was closed while this node waited")
                )
            case Wait():
                if session is not None:
                    node.core.hear(answer.seen)
                text, parked = answer.reason, answer.parked
                self.wait_reason, self.wait_kind = text, answer.cause
                self.parks += parked and not self.parked
                self.parked = parked
                self.set_due(node, join, None if parked else now + join.timeout_s)
                if parked:
                    log.info("%s waiting while the job runs without this node: %s", node.label, text)
            case _:
                assert_never(answer)

    def expire(self, node: Joiner, now: float) -> None:
        """The join's deadline passed without an answer: it times out, saying why."""
        join = self.open()
        if join is not None and join.due is not None and now >= join.due:
            self.decided(TimedOut(self.why_no_round(node)))

    def closed(self, node: Joiner, end: JobEnd, now: float) -> None:
        """The job closed while the agent's join waits (``end.failed``: the closing agent said
        the job failed, its rendezvous or its workers did)."""
        if self.open() is not None:
            waited = self.parked or (node.saw_open and node.in_round is None)
            status = node.status(now)
            failure = (status.failure if status is not None else "") or (end.why if end.failed else "")
            ran = self.parked or bool(node.heard())
            self.decided(JobOver(waited, JobEnd(failure or end.why, failed=bool(failure)), ran=ran))

    @staticmethod
    def why_no_round(node: Joiner) -> str:
        view = node.core.leader
        if view is None:
            return "no leader was found or elected"
        if view.is_self:
            return f"this node leads ({view.claim}) and no round formed"
        if node.session is None or not node.session.ready:
            return f"the leader {view.store_ip} ({view.claim}) did not welcome this node"
        return f"the leader {view.store_ip} ({view.claim}) did not answer the join in time"
