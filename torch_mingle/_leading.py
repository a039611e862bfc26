"""The leading role: how a node that won the election opens its port, holds its term, carries
out what the term decided, and gives it up.

A node that wins (``lead``) opens its control port and, once it is open (``start_term``),
writes the epoch it leads (``Ballot.lead``: a new process never leads it again) and starts a
``LeaderTerm``. Each flush hands the term's frames, closes and jobs to the step's ``Ready``,
votes for the term's own proposals as any member does, and answers the node's own join from
the term's local answers (``flush_term``). The term ends when the node steps down, gives way
to a newer term, becomes unfit, leaves or shuts down (``unlead``): its ``bye`` goes to every
member, and a join that waits goes to the next leader.
"""

from __future__ import annotations

import logging
from typing import Protocol

from torch_mingle._ballot import Ballot
from torch_mingle._claims import Claim, Role
from torch_mingle._follower import FollowerSession
from torch_mingle._frames import Ack, JoinAnswer, Propose
from torch_mingle._joining import Joiner, Joining
from torch_mingle._keys import RoundKey
from torch_mingle._leader import LeaderTerm
from torch_mingle._notes import Note, Sink
from torch_mingle._others import OtherTerms
from torch_mingle._protocol import Discovery
from torch_mingle._ready import (
    Connected,
    ConnectionAccepted,
    ConnectionClosed,
    ConnectionInput,
    FramesReceived,
    Ready,
)
from torch_mingle._records import Heard, History, Round
from torch_mingle._roles import Electing, Leading, NodeRole
from torch_mingle._rounds import RoundBook
from torch_mingle._settings import NodeSettings

log = logging.getLogger(__name__)


class Leader(Joiner, Protocol):
    """What the leading role reads of its node and asks of it (``_node.Node``)."""

    settings: NodeSettings
    core: Discovery
    ballot: Ballot
    joining: Joining
    role: NodeRole
    in_round_claim: Claim | None
    trouble: str | None
    unfit: bool
    last_error: str | None
    on_event: Sink
    term_tag: int

    @property
    def label(self) -> str: ...
    @property
    def out(self) -> Ready: ...
    @property
    def term(self) -> LeaderTerm | None: ...
    @property
    def history(self) -> History | None: ...
    def heard(self) -> Heard: ...
    def own_key(self) -> RoundKey | None: ...
    def shutting_down(self) -> bool: ...
    def vote(self, rnd: Round, base: int, covers: frozenset[RoundKey]) -> bool: ...
    def answer(self, answer: JoinAnswer | Ack, session: FollowerSession | None, now: float) -> None: ...
    def flush(self, now: float) -> None: ...


def step(term: LeaderTerm, event: ConnectionInput, now: float) -> bool:
    """A connection's input in the leading role: the term's control connections. True: the
    node flushes what it decided."""
    match event:
        case ConnectionAccepted(conn=conn, source=source):
            term.accepted(conn, now, source)
        case FramesReceived(conn=conn, frames=frames) if conn in term.conns:
            term.received(conn, frames, now)
        case ConnectionClosed(conn=conn, reason=reason, evidence=evidence):
            term.closed(conn, reason, now, evidence)
        case Connected():
            return False  # the leading role connects to nothing
    return True


def lead(node: Leader, epoch: int, now: float) -> None:
    """This node won the election for ``epoch``: it opens its control port, and leads once
    the port is open (``_start_term``)."""
    if node.shutting_down():
        # Shutting down between two leaders: it only waits to tell the next one that the
        # job closed. Leading, it would resign at once, and nobody would hear the close.
        node.core.abandon(now)
        return
    if node.unfit:
        node.core.abandon(now)  # its health check fails: a round needs its leader's node
        return
    node.role = Electing(claiming=epoch)
    node.out.listen(node.settings.bind_ip)


def cannot_lead(node: Leader, why: str, now: float) -> None:
    """The control port could not be opened: another node leads."""
    role = node.role
    if not isinstance(role, Electing) or role.claiming is None:
        return
    node.role = Electing()
    log.error("%s cannot lead: %s; leaving leadership to another node", node.label, why)
    node.last_error = why
    node.core.abandon(now)
    node.flush(now)


def start_term(node: Leader, port: int, now: float) -> None:
    """The control port is open: the term of the epoch this node won begins."""
    s = node.settings
    role = node.role
    epoch = role.claiming if isinstance(role, Electing) else None
    if isinstance(role, Electing):
        node.role = Electing()
    if epoch is None or node.core.role is not Role.CLAIMING:
        node.out.stop_listening()  # the claim was given up meanwhile
        node.flush(now)
        return
    if node.unfit or (node.shutting_down()):
        node.out.stop_listening()  # (as ``_lead``: it became unfit, or shuts down, meanwhile)
        node.core.abandon(now)
        node.flush(now)
        return
    claim = Claim(epoch=epoch, leader=s.node_id)
    node.ballot.lead(epoch)
    book = RoundBook(
        leader=s.node_id,
        epoch=epoch,
        rules=s.rules,
        others=OtherTerms(heard=node.heard()),
    )
    node.term_tag += 1
    term = LeaderTerm(
        claim=claim,
        book=book,
        advertised_ip=s.advertised_ip,
        beats=s.beats,
        label=s.label,
        own_history=node.history,
        terms=s.terms,
        seal_key=node.core.codec.key,
        on_event=node.on_event,
    )
    node.role = Leading(term, node.term_tag)
    term.start(now)
    if not node.core.leader_ready(now, s.advertised_ip, port, term.follows):
        unlead(node, "the claim was overtaken before the term started", now)
        node.flush(now)
        return
    node.on_event(Note("leader_elected", f"leads the rendezvous (epoch {epoch})"))
    log.info(
        "%s this node leads job %r (epoch %d): control port %s:%d",
        node.label,
        s.job,
        epoch,
        s.bind_ip,
        port,
    )
    node.flush(now)


def unlead(node: Leader, why: str, now: float, *, leaving: bool = False) -> None:
    term = node.term
    if term is None:
        return
    term.stand_down(why, leaving=leaving, own_key=node.own_key() if leaving else None)
    flush_term(node, term, now)
    node.out.stop_listening()
    node.role = Electing()
    if node.in_round_claim == term.claim:
        node.trouble = why
    if node.joining.open() is not None:
        node.joining.send(node, now)  # to the next leader, once known


def give_way(node: Leader, epoch: int, now: float) -> None:
    """Our term learnt of a round that a term of epoch ``epoch`` (at least as new as ours)
    formed or proposed: a round of ours now would carry a fencing token that goes back.
    The term ends, and the election runs again above that epoch. Another leader of our own
    epoch is a contested election (agents that start together), not news of trouble."""
    contested = node.term is not None and node.term.claim.epoch == epoch
    log.log(
        logging.INFO if contested else logging.WARNING,
        "%s a term of epoch %d formed or proposed a round this leader did not know of%s: its term "
        "ends, and the election runs again above epoch %d",
        node.label, epoch, " (a contested election)" if contested else "", epoch,
    )  # fmt: skip
    unlead(node, f"a newer term (epoch {epoch}) formed or proposed a round", now)
    node.core.give_way(now, epoch)


def flush_term(node: Leader, term: LeaderTerm, now: float) -> bool:
    busy = False
    # What the node heard of the job since its term began counts too: a round that ran
    # makes a first round of its own need a quorum of that round (``RoundBook._no_quorum``).
    term.hear(node.heard(), now)
    # And what the term heard of from its joiners is its node's at once, on the disk, however
    # the term ends (``unlead`` flushes it): a new process of a leader that crashed before its
    # next join must still know the job ran (seed 72012196), and so must the node's next term
    # (seed 66004668: an island's leader gave way to a joiner of the job's round, led again at
    # once, and formed alone beside that round).
    learnt = node.heard().with_heard(term.book.highest_heard())
    if learnt is not node.heard():
        node.core.hear(learnt)
        node.ballot.remember(learnt)
    for conn, frame in term.frames():
        node.out.send(conn, frame)
    for conn, _why in term.closes():
        node.out.close(conn)
    for job in term.jobs():
        node.out.submit(job, node.term_tag)
    cannot_vote = False
    for answer in term.local():
        busy = True
        if isinstance(answer, Propose):
            # The leader's own node votes for its term's proposal as any member does.
            if node.vote(answer.round, answer.base, answer.covers):
                term.accept_local(answer.round.number, now)
            elif term.needs_every_vote(answer.round.number):
                cannot_vote = True
            continue
        node.answer(answer, None, now)
    if term is node.term and cannot_vote:
        # Its own first round waits for its vote, which it cannot record (``_accept``: the
        # node knows of a round the term did not account for, or it left): it gives up the
        # lead and elects again, as any node does (a node that stopped here waited for a
        # leader it could no longer hear of, seed 723); a later term counts what it knows.
        log.warning("%s cannot record its own vote: it gives up leading", node.label)
        unlead(node, "the leader cannot record its vote", now)
        node.core.give_way(now, term.claim.epoch)
        return True
    if term is node.term and term.outdated_by is not None:
        epoch, term.outdated_by = term.outdated_by, None
        give_way(node, epoch, now)
        return True
    if term is node.term:
        status = term.status(now)
        node.core.update_status(
            now,
            # A term without a round of its own announces the highest it knows of: who hears
            # it then knows the job ran (``_heard``), and founds no job alone.
            round=status.round or term.book.highest_round(),
            heard=term.book.highest_heard(),
            members=status.size,
            closed=status.closed,
            failed=term.ended is not None and term.ended.failed,
            min_nodes=node.settings.rules.min_nodes,
            max_nodes=node.settings.rules.max_nodes,
            established=term.established,
            followers=term.connected_nodes(),
        )
    return busy


def hand_over(node: Leader, now: float) -> None:
    """A leaving leader ends its term: its ``bye`` says it leaves (the members then take
    over by succession, without its vote). No multicast resignation: it could overtake the
    ``bye`` and the members would not learn that this node left."""
    unlead(node, "the leader's node left the job", now, leaving=True)
    node.core.stop()
