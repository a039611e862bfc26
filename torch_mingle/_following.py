"""The following role: a node's session with the leader it follows, opened, listened to, and
ended.

``connect`` opens the control connection to the leader a node found and starts a
``FollowerSession`` on it (the join waiting goes with its hello); ``session_event`` carries
out what the session heard: the welcome, the status, the answers to the agent's requests, a
proposal to vote on, and the end of the session (a leader evicted this node: connect again;
else the leader is lost, and the election runs again with what its ``bye`` said of who left).
``end_session`` sends what the session still has and its ``bye``, and closes the connection.
"""

from __future__ import annotations

import logging
from typing import Protocol

from torch_mingle._claims import Claim, LeaderView
from torch_mingle._errors import StateError
from torch_mingle._follower import FollowerSession, SessionEvent, SessionOver, StatusChanged, Welcomed
from torch_mingle._frames import Ack, JoinAnswer, JoinTimedOut, Propose, Retry, RoundFormed, Wait
from torch_mingle._frames import JobClosed as ClosedAnswer
from torch_mingle._joining import Joiner
from torch_mingle._keys import RoundKey, newest_key
from torch_mingle._notes import Note, Sink
from torch_mingle._ready import (
    Connected,
    ConnectionAccepted,
    ConnectionClosed,
    ConnectionInput,
    FramesReceived,
    Ready,
)
from torch_mingle._records import History, JobEnd, Round
from torch_mingle._roles import Electing, Following, NodeRole
from torch_mingle._wire import Seal

log = logging.getLogger(__name__)


class Follower(Joiner, Protocol):
    """What the following role reads of its node and asks of it (``_node.Node``)."""

    role: NodeRole
    in_round_claim: Claim | None
    trouble: str | None
    on_event: Sink

    @property
    def out(self) -> Ready: ...
    @property
    def history(self) -> History | None: ...
    @property
    def accepted(self) -> History | None: ...
    def own_key(self) -> RoundKey | None: ...
    def leaving(self) -> bool: ...
    def connect_to(self, ip: str, port: int) -> int: ...
    def deliver_close(self, now: float) -> None: ...
    def vote(self, rnd: Round, base: int, covers: frozenset[RoundKey]) -> bool: ...
    def answer(self, answer: JoinAnswer | Ack, session: FollowerSession | None, now: float) -> None: ...


def step(node: Follower, session: FollowerSession, event: ConnectionInput, now: float) -> bool:
    """A connection's input in the following role: the session's connection only. True: the
    node flushes what it decided."""
    match event:
        case Connected(conn=conn):
            if conn != session.conn:
                return False  # a connection of an earlier session
            session.connected(now)
        case FramesReceived(conn=conn, frames=frames) if conn == session.conn:
            session.received(frames, now)
        case ConnectionClosed(conn=conn, reason=reason) if conn == session.conn:
            session.closed(reason, now)
        case ConnectionAccepted(conn=conn):
            node.out.close(conn)  # no term: nothing of this node listens for it
            return False
    return True


def connect(node: Follower, view: LeaderView, now: float) -> None:
    s = node.settings
    ip = view.store_ip
    conn = node.connect_to(ip, view.store_port)
    session = FollowerSession(
        claim=view.claim,
        ip=ip,
        port=view.store_port,
        node=s.node_id,
        own_ip=node.routes.local_ip_towards(ip),
        history=node.history,
        beats=s.beats,
        label=s.label,
        started=now,
        conn=conn,
        incarnation=s.incarnation,
        terms=s.terms,
        seen=node.heard(),
        seal=Seal(node.core.codec.key, leader=False) if node.core.codec.key is not None else None,
        on_event=node.on_event,
    )
    if node.term is not None:
        raise StateError(f"{node.label} follows a leader while it leads its own term")
    node.role = Following(session)
    node.joining.send(node, now)  # queued in the session, sent with the hello


def session_event(node: Follower, session: FollowerSession, ev: SessionEvent, now: float) -> None:
    if isinstance(ev, Welcomed):
        node.core.hear(ev.seen)
        if ev.status.closed:
            node.job_closed_seen(JobEnd("the job was closed", failed=ev.status.job_failed))
            return
        node.saw_open = True
        node.deliver_close(now)
        if node.leaving():
            # (our leave may have been lost with the last leader's connection)
            session.leave(node.own_key())
    elif isinstance(ev, StatusChanged):
        if ev.status.closed:
            node.job_closed = True
        elif ev.status.stale and ev.status.broken and session.said_broken != ev.status.round:
            session.said_broken = ev.status.round  # said once per round, by every survivor
            said = f"round {ev.status.round} broke: {ev.status.broken}"
            log.warning("%s %s", node.label, said)
            node.on_event(Note("round_broken", said))
    elif isinstance(ev, RoundFormed | Wait | Retry | JoinTimedOut | ClosedAnswer | Ack):
        node.answer(ev, session, now)
    elif isinstance(ev, Propose):
        session.tell(node.heard())  # what it heard goes before its vote
        if node.vote(ev.round, ev.base, ev.covers):
            session.accept(ev.round.number)
        else:
            session.refuse(ev.round.number, node.history, node.accepted, node.ballot.told())
    elif isinstance(ev, SessionOver):
        if session is node.session:
            end_session(node)
        if ev.misfit:
            # No leader lost, and nothing to retry: the settings differ until someone fixes them.
            log.error("%s refused by the leader of job %r: %s", node.label, node.settings.job, ev.reason)
            node.joining.refuse(ev.reason)
        elif ev.evicted:
            log.warning("%s %s; connecting again", node.label, ev.reason)
            if node.in_round_claim == session.claim:
                node.trouble = ev.reason
            view = node.core.leader
            if view is not None and view.claim == session.claim and not view.is_self:
                connect(node, view, now)
        else:
            log.warning("%s leader %s lost: %s", node.label, session.claim, ev.reason)
            # Each with the newest round it was in or voted for, the leader itself too if it
            # left (then the next leader does not wait for it there). Never a guess: a
            # departure filed under an older round than its node's newest would let that
            # node's vote be dropped where it may have counted (``RoundBook.voters_of``).
            for who, key in session.leader_reported_gone:
                if (newest := newest_key(key, node.gone.get(who))) is not None:
                    node.gone[who] = newest
            node.core.leader_failed(now, session.claim, ev.reason)


def end_session(node: Follower) -> None:
    session = node.session
    if session is not None:
        node.role = Electing()
        for frame in session.frames():  # first: with a secret, every frame has its place
            node.out.send(session.conn, frame)
        bye = session.bye(node.heard())
        if bye is not None:
            node.out.send(session.conn, bye)
        node.out.close(session.conn)
