"""What a follower does in its session with one leader, without I/O.

How it works
------------
A node that follows a leader opens one TCP connection to the leader's control port and
keeps it for the leader's whole term (``_leader.py`` is the other end):

* ``hello`` names this node and the claim it follows; the leader answers ``welcome`` with
  the job's status, or ``reject`` if it does not lead that claim (a stale announcement).
  A connection not accepted within ``connect_timeout_s``, or a hello not answered within
  ``timeout_s`` of the accept, loses the leader by silence: a leader that accepted is alive
  enough to be given the heartbeat timeout, which a new leader welcoming a thousand nodes
  at once may need.
* Heartbeats both ways every ``interval_s``; no complete frame from the leader for
  ``timeout_s`` means it is lost by silence (frozen, powered off, cut off). A connection
  refused, reset or closed ends the session too, and proves no more than silence (a partition
  produces all three); only the leader's own ``bye`` or ``reject`` says that its claim is over
  (``_evidence.judge`` decides what each one proves).
* ``join`` asks for a place in the next round (a join asked before the connection is up
  goes out right behind the hello: the leader reads a connection's frames in order and drops
  what follows a hello it rejects, so a node that joins as it connects saves a round trip,
  which is the last node's critical path); the leader answers ``round``, ``retry``
  (ask the next leader), ``timeout`` (``join_timeout`` passed, with the reason), ``closed``,
  or ``wait`` when this node starts or stops being parked behind a healthy round.
* ``arrive`` tells the leader that this node's agent enters torch's exit barrier (the
  leader acknowledges before the agent touches the barrier); ``leave`` and ``close`` end the
  node's part and the job.
* ``next`` names the store of the next round while a join waits: the node connects its
  agent's client to it ahead of time.
* ``propose``: a round the leader would form; the node records it and answers ``accept``
  (or says what it knows that the leader did not account for); the ``round`` answer that
  follows once the round formed names it by its number (``_rounds``, two phases).
* ``evicted``: the leader declared this node dead (it was frozen or cut off); the session
  ends and the node connects again as a returning node.

Outputs: frames to send (``frames()``) and events for the node (``events()``).
"""

from __future__ import annotations

import enum
import logging

from torch_mingle import _failpoints
from torch_mingle._claims import Claim
from torch_mingle._frames import (
    BEAT,
    Accept,
    Ack,
    Arrive,
    Beat,
    Bye,
    Challenge,
    Close,
    Evicted,
    Hello,
    JobClosed,
    Join,
    JoinAnswer,
    JoinTimedOut,
    LeaderFrame,
    Leave,
    Members,
    Mismatch,
    Next,
    Propose,
    Reject,
    Retry,
    RoundFormed,
    StatusPush,
    Unsealed,
    Wait,
    Welcome,
    leader_frames,
)
from torch_mingle._keys import RoundKey
from torch_mingle._notes import Note, Sink, ignore
from torch_mingle._record import field, record, replace
from torch_mingle._records import NOTHING_HEARD, Gone, Heard, History, JobEnd, Round, Status, keep_delivered
from torch_mingle._settings import Beats, Terms, describe_differences
from torch_mingle._wire import Framed, Invalid, Seal

log = logging.getLogger(__name__)

MAX_PROPOSALS_KEPT = 4


class SessionPhase(enum.Enum):
    """Where a session with the leader is: its connect, the leader's challenge (with a
    secret), its hello, the session proper, or over."""

    CONNECTING = "connecting"
    CHALLENGE = "challenge"
    HELLO = "hello"
    READY = "ready"
    OVER = "over"


@record
class Welcomed:
    status: Status
    #: The rounds of the job the leader knows of (``RoundBook.highest_heard``).
    seen: Heard = NOTHING_HEARD


@record
class StatusChanged:
    status: Status


@record
class SessionOver:
    """The session ended: the leader is lost, or it evicted us. What ended it is in ``reason``
    only: a lost leader's claim is suspected whatever the cause (``Discovery.leader_failed``),
    and who left reaches the node through ``leader_reported_gone``."""

    reason: str
    evicted: bool = False
    #: The leader refused this node's settings (``Mismatch``): its joins fail, it does not retry.
    misfit: bool = False


#: The leader's answers come as its frames read them (``_frames``: ``RoundFormed`` with its
#: round in place), its proposals as ``Propose``.
SessionEvent = Welcomed | JoinAnswer | Ack | StatusChanged | SessionOver | Propose


@record(frozen=False)
class FollowerSession:
    """One node's connection to the leader of one claim."""

    claim: Claim
    ip: str
    port: int
    node: int
    own_ip: str
    history: History | None
    #: Its heartbeats and their bounds (``_settings.Beats``).
    beats: Beats
    label: str
    started: float
    conn: int = -1
    #: Which process of this node id this is (``_identity``).
    incarnation: int = 1
    #: The rounds of the job this node heard of, told in the hello: a leader that never heard
    #: of them learns from it that they ran (``OtherTerms.unaccounted``).
    seen: Heard = NOTHING_HEARD
    #: With a secret: the connection's authentication (``_wire.Seal``); the hello waits for the
    #: leader's challenge.
    seal: Seal | None = None
    #: Where the session's rendezvous events go (``_events``).
    on_event: Sink = ignore
    #: What must agree across the job (``_settings.Terms``), said in the hello.
    terms: Terms = ()
    #: The round whose breaking this node logged (each survivor says once what broke it).
    said_broken: int = 0
    phase: SessionPhase = SessionPhase.CONNECTING
    status: Status | None = None
    last_heard: float = 0.0
    #: The store the leader opened for its next round (``next``), if it named one.
    next_store_port: int | None = None
    #: The rounds this leader delivered on this connection, by number (the last few): a join
    #: names its history by number when it is one of them (``ref``), see ``LeaderTerm._history_of``.
    delivered: dict[int, Round] = field(default_factory=dict)
    #: The rounds the leader proposed on this connection, newest last: its ``round`` answer
    #: names the one that formed.
    proposals: dict[int, Round] = field(default_factory=dict)
    #: The leader said ``bye``: it closes our connection alive (it stepped down).
    leader_said_bye: bool = False
    #: ... and its node leaves the job (preempted): it no longer votes.
    leader_left: bool = False
    #: Members of the round the leader knew had left, each with the round it left, from its
    #: ``bye`` (the leader itself too, when it leaves).
    leader_reported_gone: Gone = ()
    #: The connection is established and not closed by the other end.
    conn_up: bool = False
    _next_beat: float = 0.0
    _queued: list[bytes] = field(default_factory=list)
    _queued_join: bytes | None = None
    #: The node's ``heard`` that ``tell`` last read (the same object while nothing is new).
    _heard_read: Heard | None = None
    _frames: list[bytes] = field(default_factory=list)
    _events: list[SessionEvent] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return self.phase is SessionPhase.READY

    @property
    def over(self) -> bool:
        return self.phase is SessionPhase.OVER

    # ------------------------------------------------------------ inputs

    def connected(self, now: float) -> None:
        if self.phase is not SessionPhase.CONNECTING:
            return
        self.conn_up = True
        self.last_heard = now
        if self.seal is not None:
            self.phase = SessionPhase.CHALLENGE  # the hello answers the leader's challenge
            return
        self._say_hello(self._hello().encode())

    def _hello(self) -> Hello:
        hist = self.history
        return Hello(
            node=self.node,
            epoch=self.claim.epoch,
            leader=self.claim.leader,
            ip=self.own_ip,
            # Only what the leader needs to count its support: which round we were last in, and its size.
            last=(hist.epoch, hist.round, len(hist.members)) if hist else None,
            inc=self.incarnation,
            seen=self.seen,
            ahead=True,  # send ``next``: this node connects to the next round's store ahead
            terms=self.terms,
        )

    def _say_hello(self, hello: bytes) -> None:
        self.phase = SessionPhase.HELLO
        self._frames.append(hello)
        for frame in self._queued:  # right behind the hello, in order (see the module doc)
            self._out(frame)
        self._queued.clear()
        if self._queued_join is not None:
            self._out(self._queued_join)
            self._queued_join = None

    def _out(self, frame: bytes) -> None:
        self._frames.append(self.seal.seal(frame) if self.seal is not None else frame)

    def closed(self, reason: str, now: float) -> None:
        """The connection ended (``reason``: what the transport saw)."""
        self.conn_up = False
        if self.phase is SessionPhase.OVER:
            return
        if self.leader_said_bye:  # its bye said why, before it closed
            why = "it leaves" if self.leader_left else "it no longer leads"
            self._end(f"the leader {self.ip}:{self.port} said bye: {why}")
        else:
            self._end(f"the connection to the leader {self.ip}:{self.port} ended: {reason}")

    def received(self, frames: list[Framed] | Invalid, now: float) -> None:
        if self.phase in (SessionPhase.OVER, SessionPhase.CONNECTING):
            return
        _failpoints.hit("follower.frame")
        if isinstance(frames, Invalid):
            self._end(f"protocol error from the leader: {frames.reason}")
            return
        for frame in leader_frames(frames, self.seal):
            if self.over:  # a frame before this one ended the session
                return
            seal = self.seal
            if seal is not None and self.phase is SessionPhase.CHALLENGE:
                hello = (
                    seal.hello(frame.nonce, **self._hello().fields())
                    if isinstance(frame, Challenge)
                    else None
                )
                if hello is None:
                    self._end("the leader did not open with a challenge (no secret there?)")
                    return
                self.last_heard = now
                self._say_hello(hello)
                continue
            if isinstance(frame, Unsealed):
                why = "a frame from the leader without this connection's MAC (another secret?)"
                self._end(why)
                return
            if isinstance(frame, Challenge):
                self._end("protocol error from the leader: a challenge after the handshake")
                return
            if isinstance(frame, Invalid):
                self._end(f"protocol error from the leader: {frame.reason}")
                return
            self._dispatch(frame, now)

    def handle_timer(self, now: float) -> None:
        if self.phase is SessionPhase.CONNECTING:
            if now >= self.started + self.beats.connect_timeout_s:
                self._end(
                    f"the leader {self.ip}:{self.port} did not accept our connection "
                    f"within {self.beats.connect_timeout_s:g}s"
                )
            return
        if self.phase in (SessionPhase.CHALLENGE, SessionPhase.HELLO):
            if now >= self.last_heard + self.beats.timeout_s:  # last_heard: the accept
                self._end(
                    f"the leader {self.ip}:{self.port} did not answer our hello "
                    f"within {self.beats.timeout_s:g}s"
                )
            return
        if self.phase is not SessionPhase.READY:
            return
        if now >= self.last_heard + self.beats.timeout_s:  # the same sum as next_timer(): no float gap
            self._end(f"no heartbeat from the leader for {self.beats.timeout_s:g}s")
            return
        if now >= self._next_beat:
            self._next_beat = now + self.beats.interval_s
            self._out(BEAT.encode())
            self.on_event(Note("keep_alive", f"sent a keep-alive heartbeat to the leader {self.ip}"))

    def next_timer(self) -> float | None:
        if self.phase is SessionPhase.CONNECTING:
            return self.started + self.beats.connect_timeout_s
        if self.phase in (SessionPhase.CHALLENGE, SessionPhase.HELLO):
            return self.last_heard + self.beats.timeout_s
        if self.phase is SessionPhase.READY:
            return min(self._next_beat, self.last_heard + self.beats.timeout_s)
        return None

    # ------------------------------------------------------------ requests

    def tell(self, heard: Heard) -> None:
        """What the node heard of the job (``heard``): rounds of other terms it did not tell
        this leader yet (in the hello, a join or a beat) go out now, before anything else it
        sends, a vote included: the leader may have to account for them (``LeaderTerm.hear``;
        seed 50005902: a voter heard of another side's first round after its join went out,
        and the round it voted for formed beside it)."""
        if heard is self._heard_read:
            return  # (every step asks; a node's ``heard`` is a new object only when it grew)
        self._heard_read = heard
        told, self.seen = set(self.seen.keys), self.seen.with_heard(heard)
        term = (self.claim.epoch, self.claim.leader)
        news = any(k not in told for k in self.seen.beyond(0, term, None).keys)
        if news and self.phase in (SessionPhase.HELLO, SessionPhase.READY):
            self._out(Beat(seen=self.seen).encode())  # (before the hello, the hello tells it)

    def join(self, join: Join) -> None:
        """Ask for a place in the next round (before the connection is up: sent with the hello,
        replacing an older ask). Its last round goes by number when this leader sent it here
        (``ref``: the leader holds its members)."""
        self.seen = self.seen.with_heard(join.seen)
        self.history = join.history
        frame = replace(join, ref=self._delivered_number(join.history)).encode()
        if self.phase in (SessionPhase.HELLO, SessionPhase.READY):
            self._out(frame)
        elif self.phase is not SessionPhase.OVER:
            self._queued_join = frame

    def _delivered_number(self, history: History | None) -> int | None:
        """``history``'s number if this leader formed it and sent it on this connection: the
        leader holds its members, so the join need not carry them (O(N) bytes a join)."""
        if history is None or history.epoch != self.claim.epoch or not history.members:
            return None
        rnd = self.delivered.get(history.round)
        if rnd is None or history.members[0] != self.claim.leader:
            return None
        same = rnd.members is history.members or rnd.members == history.members
        return history.round if same else None

    def accept(self, number: int) -> None:
        """This node recorded proposal ``number``: its vote for it."""
        self._out(Accept(number, ok=True).encode())

    def refuse(
        self, number: int, history: History | None, accepted: History | None, earlier: tuple[History, ...]
    ) -> None:
        """This node may not accept proposal ``number``: what it knows, for the leader to account for."""
        self._out(Accept(number, ok=False, history=history, accepted=accepted, earlier=earlier).encode())

    def arrive(self, ticket: int, round_number: int, epoch: int) -> None:
        self._request(Arrive(ticket, round_number, epoch).encode())

    def bye(self, seen: Heard = NOTHING_HEARD) -> bytes | None:
        """The frame to send before this node closes the connection itself (it gave up on the
        leader, or follows another), so that the leader knows it is alive; ``seen``: the rounds
        of the job the node heard of (it may leave for a leader whose job ran)."""
        if not self.conn_up or self.phase in (SessionPhase.CONNECTING, SessionPhase.CHALLENGE):
            return None
        if self.seal is not None and not self.seal.ready:
            return None
        frame = Bye(seen=seen).encode()
        return self.seal.seal(frame) if self.seal is not None else frame

    def leave(self, own_key: RoundKey | None = None) -> None:
        """Leave the job; ``own_key``: the newest round this node was in or voted for (its
        departure counts for that round's successor only, ``RoundBook.voters_of``)."""
        self._queued_join = None  # a node that leaves asks for no round (the join is answered)
        self._request(Leave(own_key).encode())

    def close_job(self, end: JobEnd) -> None:
        self._request(Close(end).encode())

    # ------------------------------------------------------------ outputs

    def frames(self) -> list[bytes]:
        out, self._frames = self._frames, []
        return out

    def events(self) -> list[SessionEvent]:
        out, self._events = self._events, []
        return out

    # ------------------------------------------------------------ helpers

    def _request(self, frame: bytes) -> None:
        if self.phase in (SessionPhase.HELLO, SessionPhase.READY):
            self._out(frame)
        elif self.phase is not SessionPhase.OVER:
            self._queued.append(frame)  # sent with the hello, once the connection is up

    def _dispatch(self, frame: LeaderFrame, now: float) -> None:
        self.last_heard = now
        if self.phase is SessionPhase.HELLO:
            self._hello_frame(frame, now)
        else:
            self._ready_frame(frame)

    def _hello_frame(self, frame: LeaderFrame, now: float) -> None:
        match frame:
            case Welcome(epoch=epoch) if epoch == self.claim.epoch:
                self.status = frame.status
                self.phase = SessionPhase.READY
                self._next_beat = now + self.beats.interval_s
                self._events.append(Welcomed(self.status or Status(), seen=frame.seen))
            case Reject():
                self._end(f"the leader rejected us: {frame.why}")
            case Mismatch():
                self._end(describe_differences(frame.diffs), misfit=True)
            case Bye():  # it stepped down or shuts down with our hello in flight
                self._said_bye(frame)
            case _:
                self._end(f"protocol error: {type(frame).__name__.lower()} before welcome")

    def _ready_frame(self, frame: LeaderFrame) -> None:
        match frame:
            case Beat():
                pass
            case StatusPush(status=status) if status is not None:
                self._status_changed(status)
            case StatusPush():
                pass  # a status this node cannot read: it keeps the one it knows
            case Members():
                # A formed round this node did not get as a proposal: the answer that follows names it.
                self._keep_proposal(frame.round)
            case Propose():
                self._keep_proposal(frame.round)
                self._events.append(frame)
            case RoundFormed():
                # The round itself, or (when it was proposed on this connection) its number.
                rnd = frame.round
                if rnd is None:
                    assert frame.number is not None  # noqa: S101 - ``_frames._formed``: one of the two
                    rnd = self.proposals.get(frame.number)
                    if rnd is None:
                        self._end(
                            f"protocol error from the leader: round {frame.number} was not proposed here"
                        )
                        return
                if frame.status is not None:  # the status the round runs under (leader's _form)
                    self._status_changed(frame.status)
                self.next_store_port = None  # used by this round, or not by any: named again if due
                keep_delivered(self.delivered, rnd)
                self._events.append(RoundFormed(frame.ticket, round=rnd))
            case Retry() | JoinTimedOut() | Wait() | JobClosed() | Ack():
                # (After a retry or a timeout the store named stays the next round's: the leader
                # names each store once per node.)
                self._events.append(frame)
            case Next():
                self.next_store_port = frame.port
            case Bye():
                self._said_bye(frame)
            case Evicted():
                self._end(f"the leader declared this node dead: {frame.why}", evicted=True)
            case _:
                self._end(f"protocol error: unexpected {type(frame).__name__.lower()} from the leader")

    def _status_changed(self, status: Status) -> None:
        self.status = status
        self._events.append(StatusChanged(status))

    def _keep_proposal(self, rnd: Round) -> None:
        self.proposals.pop(rnd.number, None)  # the newest last
        self.proposals[rnd.number] = rnd
        while len(self.proposals) > MAX_PROPOSALS_KEPT:
            del self.proposals[next(iter(self.proposals))]

    def _said_bye(self, bye: Bye) -> None:
        """The leader closes our connection itself; the close that follows ends the session."""
        self.leader_said_bye = True
        self.leader_left = bye.leaving
        self.leader_reported_gone = bye.gone

    def _end(self, reason: str, *, evicted: bool = False, misfit: bool = False) -> None:
        self.phase = SessionPhase.OVER
        self._queued.clear()
        self._queued_join = None
        self._events.append(SessionOver(reason, evicted=evicted, misfit=misfit))
