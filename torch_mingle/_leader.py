"""What the leader does during its term, without I/O.

How it works
------------
A node that wins the election opens a control port and runs one ``LeaderTerm`` until it
steps down or shuts down. Every other node of the job keeps one TCP connection to it
(``_follower.py`` is the other end); the leader's own node talks to the term directly.

* **Hello.** With a secret, the leader opens each connection with a challenge, and every
  frame after it carries a MAC keyed from the secret and that connection (``_wire.Seal``): a
  host without the secret cannot say hello. A connection's first frame names the node and the
  claim (epoch, leader) it expects; a node that expects another claim is rejected, so a stale
  announcement can never attach a node to the wrong term. A node that does not say hello within
  ``hello_timeout_s`` is dropped, and so is a second connection of the same node (the
  newer one wins: the node reconnected).
* **Liveness.** Heartbeats both ways every ``interval_s``. A node whose connection ends
  (closed, reset: its process died, or a firewall or NAT between us) or that sends no complete
  frame for ``timeout_s`` (frozen, cut off, or writing too slowly) is lost, dropped when that
  bound ends (not at the next beat): the round book marks it and, if it was in the running
  round, the round goes stale so the others re-join. It keeps its vote (``_evidence``).
* **Joins and rounds.** ``join`` asks for a place in the next round. The ``RoundBook``
  decides; a round forms on a fresh TCPStore (``OpenStore``, opened ahead of time on the
  shell's worker thread) and every admitted node gets its ``round`` frame. A joiner that
  waits gets ``wait`` frames when it starts or stops being *parked* (a healthy round runs
  without it), and ``timeout`` with the reason when its ``join_timeout`` ends unparked.
* **Establishment.** The claim is *established* once a round formed in this term, or once
  a majority of the last round's members follow it (a failover): only then can it replace
  another established leader (see ``_protocol.py``).
* **Exit barrier.** Members report when their agent enters torch's exit barrier
  (``arrive``); once every member has arrived or is gone, and some are gone for good, the
  leader opens the barrier (``OpenExitBarrier``) instead of letting the others wait 300 s.
* **Status.** ``status`` frames carry what ``num_nodes_waiting()`` needs, pushed when it
  changes, so the agent's frequent polls never wait on the network; a ``round`` frame
  carries the status its round starts under.

Outputs: frames per connection (``frames()``), connections to close (``closes()``), jobs for
the shell's worker thread (``jobs()``) and answers for the leader's own node (``local()``).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from torch_mingle._claims import Claim
from torch_mingle._desk import JoinDesk
from torch_mingle._door import Door
from torch_mingle._evidence import Evidence, judge
from torch_mingle._frames import (
    BEAT,
    Accept,
    Ack,
    Arrive,
    Beat,
    Bye,
    Close,
    Evicted,
    Hello,
    JobClosed,
    Join,
    JoinAnswer,
    LeaderFrame,
    Leave,
    Mismatch,
    NodeFrame,
    OutOfContext,
    Propose,
    Reject,
    Retry,
    Unsealed,
    View,
    Welcome,
    node_frames,
)
from torch_mingle._jobs import Job, OpenExitBarrier, OpenStore
from torch_mingle._jobview import job_view
from torch_mingle._keys import RoundKey, newest_key
from torch_mingle._member import ConnId, Member
from torch_mingle._notes import Note, Sink, ignore
from torch_mingle._ports import StorePorts
from torch_mingle._proposals import Vote
from torch_mingle._push import Pusher
from torch_mingle._record import assert_never, field, record
from torch_mingle._records import Heard, History, JobEnd, Round, Status, node_hex
from torch_mingle._rounds import Form, RoundBook
from torch_mingle._settings import Beats, Terms, differences
from torch_mingle._wire import Framed, Invalid, Seal, frame_digest

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 65536

#: The heartbeat, encoded once (a thousand members get the same bytes every interval).
HB_FRAME = BEAT.encode()
HB_DIGEST = frame_digest(HB_FRAME)


#: What the leader's own node is told (it joins without a connection): what a member's
#: session reads from the frames, the proposals of its term included.
LocalAnswer = JoinAnswer | Ack | Propose


@record(frozen=False)
class ControlCounters:
    """What a leader's term has handled: frames in and out, joins, jobs for the worker thread."""

    frames_in: int = 0
    frames_out: int = 0
    beats_in: int = 0  # heartbeats, also counted in frames_in and frames_out
    beats_out: int = 0
    joins: int = 0
    jobs: int = 0


#: Frames after which the book decides nothing new: heartbeats (a thousand members' beats are
#: a thousand batches per interval, and a decision looks at every pending join) and accepts
#: (``_accepted`` decides once the round forms).
_NO_DECISION = frozenset({Beat, Accept})


@record(frozen=False)
class LeaderTerm:
    """The leader's side of the control plane for one term (one epoch)."""

    claim: Claim
    book: RoundBook
    advertised_ip: str
    #: Its heartbeats and their bounds (``_settings.Beats``).
    beats: Beats
    label: str
    own_history: History | None = None
    #: What must agree across the job (``_settings.Terms``): a hello whose terms differ is refused.
    terms: Terms = ()
    hello_timeout_s: float = HELLO_TIMEOUT_S
    conns: dict[ConnId, Member] = field(default_factory=dict)
    established: bool = False
    #: How the job ended, as its "closed" answers say it (``close_job``); None: it goes on.
    ended: JobEnd | None = None
    _self: Member | None = None
    _by_node: dict[int, Member] = field(default_factory=dict)
    #: Connections that said no hello yet, by the address they came from (``_door``).
    door: Door = field(default_factory=Door)
    #: How many identified members report each last round (``Member.last``), kept as members
    #: come, go and join: whether the term is established is then a look at a few keys, not a
    #: pass over every member at every hello (a new leader of a thousand nodes).
    _support: Counter[tuple[int, int, int]] = field(default_factory=Counter)
    #: The join that the current round answered, per member: (its process, its ticket); a
    #: restarted agent's tickets count from 1 again.
    _frames: list[tuple[ConnId, bytes]] = field(default_factory=list)
    _closes: list[tuple[ConnId, str]] = field(default_factory=list)
    _jobs: list[Job] = field(default_factory=list)
    _local: list[LocalAnswer] = field(default_factory=list)
    _offer_after_decide: list[Member] = field(default_factory=list)
    #: Its members' joins: their answers, deadlines and parking (``_desk``).
    desk: JoinDesk = field(default_factory=JoinDesk)
    #: What it pushes to its round's members, and to whom (``_push``).
    push: Pusher = field(default_factory=Pusher)
    #: The two-phase round: what it proposed and what its decisions keep (``_proposals``).
    vote: Vote = field(default_factory=Vote)
    #: With a secret: the key every control connection is authenticated with (``Seal``).
    seal_key: bytes | None = None
    #: Where the term's rendezvous events go (``_events``).
    on_event: Sink = ignore
    #: Set when a term at least as new as this one formed or proposed a round this leader knows
    #: of (its epoch): the node gives this term up for a newer one (``Node._flush_term``).
    outdated_by: int | None = None
    #: Frames that may change the decision came in at this time: one decision for the whole
    #: batch, made before any output is read (``_settle``), not one per connection that spoke.
    _decide_due: float | None = None
    _next_beat: float = 0.0
    #: A sweep for silent members before the next beat: the first one's bound ends sooner.
    _sweep_at: float | None = None
    _now: float = 0.0
    #: When to open the next round's store (``NEXT_STORE_DELAY_S`` after a round formed).
    #: Its stores: the next round's spare, its last rounds' (``_ports``).
    ports: StorePorts = field(default_factory=StorePorts)
    _barrier_opened: int = 0
    _stopped: bool = False
    #: What this term has done, for diagnostics and the scale benchmark's cost per join.
    counters: ControlCounters = field(default_factory=ControlCounters)

    @property
    def spare_port(self) -> int | None:
        """The store the next round will use, once it is open (this node's agent connects ahead):
        the proposed round's while its votes come in, else the spare one."""
        if self.vote.current is not None:
            return self.vote.current.port
        return self.ports.spare  # None once the term stood down (``release_stores``)

    # ------------------------------------------------------------ lifecycle

    @property
    def _hb_digest(self) -> bytes | None:
        return HB_DIGEST if self.seal_key is not None else None

    def start(self, now: float) -> None:
        self.ports.jobs = self._jobs  # one list: the jobs go out in the order they were decided
        self._next_beat = now + self.beats.interval_s
        self.ports.request(stopped=self._stopped)
        self._update_established()
        self._decide(now)

    def stand_down(self, why: str, *, leaving: bool = False, own_key: RoundKey | None = None) -> None:
        """The term ends (a better claim won, an internal error, or ``leaving``: the leader's node
        leaves the job): every waiter re-joins elsewhere."""
        if self._stopped:
            return
        self._stopped = True
        for m in list(self.desk.members(self)):
            if m.join_id is not None:
                self.desk.answer(self, m, Retry, why=why)
        # Alive and staying: the members must not count this node as gone; leaving: they must.
        # Either way they learn who of the round is gone: the next leader's voting set.
        # Each with the newest round it was in or voted for: only that round's successor counts
        # without its vote (``voters_of``). Leaving, this node too (``own_key``: its own word).
        if leaving:
            self._left(self.claim.leader, own_key)
        rnd = self.book.current
        departed = self.book.ledger.departed_of(rnd.member_set) if rnd else []
        if leaving:
            departed = sorted({*departed, self.claim.leader})
        gone = tuple((n, key) for n in departed if (key := self.book.ledger.left_in(n)) is not None)
        bye = Bye(leaving, gone).encode()
        for m in list(self.conns.values()):
            self._out(m, bye)
        for conn in list(self.conns):
            self._closes.append((conn, why))
        self.conns.clear()
        self._by_node.clear()
        self._support.clear()
        self.release_stores()

    def release_stores(self) -> None:
        """Stop every store of the term (it stepped down, or its node shut down)."""
        self.ports.release_all(self.vote.current.port if self.vote.current is not None else None)
        self.vote.current = None

    # ------------------------------------------------------------ inputs

    def accepted(self, conn: ConnId, now: float, source: str = "") -> None:
        """A connection from ``source`` (an address): a node's, once it says hello."""
        if len(self.conns) >= MAX_CONNECTIONS:
            self._closes.append((conn, "too many connections"))
            return
        if self.door.full():
            victim = self.door.give_way(source)
            if victim is None:
                self._closes.append((conn, "too many connections without a hello"))
                return
            oldest, held = victim
            self._close(oldest, f"gave way: {held} connections from {oldest.source or '?'} said no hello")
        member = self.conns[conn] = Member(conn=conn, opened=now, last_heard=now, source=source)
        self.door.add(member)
        if self.seal_key is not None:
            member.seal = Seal(self.seal_key, leader=True)
            self._frames.append((conn, member.seal.challenge()))

    def closed(self, conn: ConnId, reason: str, now: float, evidence: Evidence = Evidence.CLOSED) -> None:
        """A member's connection ended, with ``evidence`` of how. Whatever ended it (a reset, a
        close, a refusal), it proves nothing a partition could not produce (``_evidence.judge``):
        the node is lost for the running round, and keeps its vote; only its own ``leave`` takes it."""
        member = self.conns.pop(conn, None)
        if member is None or member.node is None:
            if member is not None:
                self.door.passed(member)
            return
        if self._forget(member):
            rnd = self.book.current
            if member.said_bye and (rnd is None or member.node not in rnd.member_set):
                self._withdrawn(member.node, reason, now)
            else:
                self._node_lost(member.node, reason, now, votes=judge(evidence).votes)

    def received(self, conn: ConnId, frames: list[Framed] | Invalid, now: float) -> None:
        member = self.conns.get(conn)
        if member is None:
            return
        if isinstance(frames, Invalid):
            self._drop(member, f"protocol error from the node: {frames.reason}", now)
            return
        self.counters.frames_in += len(frames)
        decides = False
        for frame in node_frames(frames, member.seal):
            if self.conns.get(conn) is not member:
                return  # dropped by an earlier frame
            if isinstance(frame, Unsealed):
                # With a secret, a frame without this connection's MAC (a hello from a host that
                # does not know the secret, a frame added or replayed on the way) ends it.
                self._drop(member, "a frame without this connection's MAC (not authenticated)", now)
                return
            if isinstance(frame, Invalid):
                # The peer broke the protocol: that costs it its connection, never our term.
                self._drop(member, f"protocol error from the node: {frame.reason}", now)
                return
            try:
                self._dispatch(member, frame, now)
            except OutOfContext as exc:  # (anything else is our own error: ``Node.recover``)
                self._drop(member, f"protocol error from the node: {str(exc)[:120]}", now)
                return
            decides = decides or type(frame) not in _NO_DECISION
        if decides:
            self._decide_due = now

    def job_done(self, job: Job, result: object, error: str | None, now: float) -> None:
        if isinstance(job, OpenStore):
            if error is not None:
                self.ports.failed(error, now, wanted=self.vote.wanted is not None, label=self.label)
                return
            if not self.ports.opened(int(str(result)), stopped=self._stopped):  # (a port)
                return
            self._offer_after_decide.extend(
                m for m in self._by_node.values() if self.desk.may_join_next(self, m)
            )
            self._decide(now)
        elif isinstance(job, OpenExitBarrier) and error is not None:
            log.warning("%s could not open the exit barrier of round %d: %s", self.label, job.round, error)

    def handle_timer(self, now: float) -> None:
        self._settle()
        self.ports.due(now, stopped=self._stopped)
        if now >= self._next_beat:
            self._next_beat = now + self.beats.interval_s
            self._sweep(now, beat=True)
        elif self._sweep_at is not None and now >= self._sweep_at:
            self._sweep(now, beat=False)
        self.desk.check_joins(self, now)
        if self.vote.wait_until is not None and now >= self.vote.wait_until:
            self.vote.wait_until = None
            self._decide(now)

    def next_timer(self) -> float | None:
        self._settle()
        if self._stopped:
            return None
        times = [self._next_beat]
        if self._sweep_at is not None:
            times.append(self._sweep_at)
        if self.vote.wait_until is not None:
            times.append(self.vote.wait_until)
        times.extend(self.ports.timers())
        deadline = self.desk.next_deadline()
        if deadline is not None:
            times.append(deadline)
        return min(times)

    # ------------------------------------------------- the leader's own node

    def join_local(self, join: Join, now: float) -> None:
        """The leader's own node joins, as a member's join frame reads (``join.ip``: its own)."""
        if self._self is None:
            self._self = Member(conn=None, opened=now, node=self.claim.leader, last_heard=now)
        self.desk.asked(self, self._self, join, now)
        self._decide(now)

    def arrive_local(self, ticket: int, round_number: int, now: float) -> None:
        self._arrive(self.claim.leader, round_number)
        self._local.append(Ack(ticket))

    def leave_local(self, now: float, own_key: RoundKey | None = None) -> None:
        """The leader's own node leaves (its agent is done, whether its workers succeeded or
        not); ``own_key``: the newest round it was in or voted for."""
        self._left(self.claim.leader, own_key)
        self._after_departure(now)

    def _left(self, node: int, said: RoundKey | None) -> None:
        """``node`` leaves the job; ``said``: the newest round it was in or voted for, by its own
        word. What this term saw of it counts too (``RoundBook.known_key``)."""
        self.book.leave(node, newest_key(said, self.vote.voted_for(node)))

    def others_rejoined(self) -> bool:
        """Every other live member of the current round waits in a join (its workers stopped)."""
        rnd = self.book.current
        if rnd is None:
            return True
        others = rnd.member_set - {self.claim.leader} - self.book.ledger.out_of(rnd.member_set)
        return others <= self.book.pending.keys()

    def close_job(self, by: int, end: JobEnd, now: float) -> None:
        """No further rounds: the job is over (``end.why``: why, for the waiters, with who closed
        it; ``end.stops_round``: its round cannot start, so the members running it stop too;
        ``end.failed``: the closing agent failed, so the nodes still waiting for a place fail
        too, while the members running a round that is whole finish as their own workers do:
        one that a member left before its exit barrier cannot, and stops,
        ``Snapshots.round_state``)."""
        if self.book.closed:
            return
        why = f"node {node_hex(by)} closed the job" + (f" ({end.why})" if end.why else "")
        self.ended = ended = JobEnd(why, stops_round=end.stops_round, failed=end.failed or end.stops_round)
        for node in self.book.close(ended):
            m = self._by_node.get(node) if node != self.claim.leader else self._self
            if m is not None:
                self.desk.answer(self, m, JobClosed, end=ended)
        log.info("%s rendezvous closed: %s", self.label, why)
        self.on_event(Note("closed", f"marked the rendezvous as closed: {why}", "SUCCEEDED"))
        self._decide(now)

    # ------------------------------------------------------------ outputs

    def _settle(self) -> None:
        """Make the decision the frames received since the last one call for (``_decide_due``)."""
        if self._decide_due is not None:
            self._decide(self._decide_due)

    def frames(self) -> list[tuple[ConnId, bytes]]:
        self._settle()
        if not self._stopped:
            self.push.flush(self.book, self._by_node, self._out, sealed=self.seal_key is not None)
        out, self._frames = self._frames, []
        self.counters.frames_out += len(out)
        return out

    def closes(self) -> list[tuple[ConnId, str]]:
        self._settle()
        out, self._closes = self._closes, []
        return out

    def jobs(self) -> list[Job]:
        self._settle()
        out = list(self._jobs)
        self._jobs.clear()  # (in place: the stores' part appends to it too, ``start``)
        self.counters.jobs += len(out)
        return out

    def local(self) -> list[LocalAnswer]:
        self._settle()
        out, self._local = self._local, []
        return out

    def status(self, now: float) -> Status:
        self._settle()
        return self.book.status(now)

    def connected_nodes(self) -> int:
        return len(self._by_node)

    def follows(self, node: int) -> bool:
        """Whether ``node`` is connected to this term (said hello)."""
        return node in self._by_node

    def all_gone(self) -> bool:
        return self.book.all_gone()

    # ------------------------------------------------------------ frames in

    def _dispatch(self, m: Member, frame: NodeFrame, now: float) -> None:
        m.last_heard = now
        if m.node is None:
            if isinstance(frame, Hello):
                self._hello(m, frame, now)
            else:
                self._drop(m, f"protocol error: {type(frame).__name__.lower()} before hello", now)
            return
        match frame:
            case Beat():
                self.counters.beats_in += 1
                self.hear(frame.seen, now)
            case Join():
                self.desk.asked(self, m, frame, now)
            case Accept(ok=True):
                self.vote.accepted(self, m.node, frame.round, now)
            case Accept():
                self.vote.refused(self, m, frame, now)
            case Arrive():
                if frame.epoch is None or frame.epoch == self.claim.epoch:
                    self._arrive(m.node, frame.round)
                self._send_record(m, Ack(frame.ticket))
            case Bye():
                m.said_bye = True
                if m.join_id is not None:
                    # Its join goes with the connection (the node joins again where it goes): the
                    # decision at the end of this batch must not put it in a round. A node that
                    # gives up on a slow welcome sends hello, join and bye before we read any.
                    m.join_id = None
                    self.desk.set_deadline(self, m, None)
                    self.book.withdraw(m.node)
                self.hear(frame.seen, now)  # (after: a decision it brings must not count its join)
            case Leave():
                self.book.chronicle.left(self.book.current, m.node, now)
                self._left(m.node, frame.left)  # (None: it counts for no round: it keeps its vote)
                self._after_departure(now)
            case Close():
                self.close_job(m.node, frame.end, now)
            case Hello():
                self._drop(m, "protocol error: a second hello", now)
            case _:
                assert_never(frame)

    def _hello(self, m: Member, hello: Hello, now: float) -> None:
        node, leader = hello.node, hello.leader
        if hello.observe:  # ``torch-mingle status``: the job as this leader sees it, then goodbye
            self._send_record(m, View(job_view(self.book, self.claim.leader, self.advertised_ip, now)))
            self._close(m, "an observer")
            return
        if node == self.claim.leader:
            self._drop(m, "protocol error: a hello with the leader's own node id", now)
            return
        if Claim(epoch=hello.epoch, leader=leader) != self.claim:
            self._send_record(
                m, Reject(f"this node leads {self.claim}, not epoch {hello.epoch} leader {leader:016x}")
            )
            self._close(m, "wrong claim")
            return
        if diffs := differences(self.terms, hello.terms):
            self._send_record(m, Mismatch(diffs))
            self._close(m, "its settings differ from the job's")
            self.door.misfit(self.label, hello.node, hello.ip, diffs, now)
            return
        inc = hello.inc
        old = self._by_node.get(node)
        if old is not None and old is not m and old.incarnation > inc:
            # An older process of a node whose newer one is connected (it was frozen, say): the
            # newer one holds the node's identity and vote.
            self._send_record(
                m, Reject(f"incarnation {old.incarnation} of node {node_hex(node)} is connected")
            )
            self._close(m, "an older incarnation")
            return
        m.incarnation = inc
        if old is not None and old is not m:
            old.node = None  # superseded: the node reconnected; not a death
            # Said, not just closed: if it is not the node's own reconnect (someone else uses its
            # id), the node must connect again, not take the close as the leader's death.
            self._send_record(old, Evicted("another connection said hello with this node's id"))
            self._close(old, "superseded by a new connection of the same node")
            self.book.withdraw(node)  # its join, if any, comes again on the new connection
            if old.incarnation < inc:
                # A new process took the node's id (``_identity``: only a dead one's): the old one
                # and its workers are gone, and its round with them.
                self.book.died(node, f"a new process of the node started (incarnation {inc})")
        m.node = node
        self.door.passed(m)
        m.connects_ahead = hello.ahead
        if old is not None:
            self._forget(old, node)
        self._by_node[node] = m
        self._set_last(m, hello.last)
        self.hear(hello.seen, now)
        self.push.hello(node)
        self.book.ips[node] = hello.ip
        self._send_record(m, Welcome(self.claim.epoch, self.book.status(now), self.book.highest_heard()))
        if not self.book.parked(node):
            self.desk.offer_spare(self, m)  # its agent's first join is likely on its way
        proposal = self.vote.current
        if proposal is not None and (
            node in proposal.form.members or any(node in c for c in proposal.form.constraints)
        ):
            proposal.sent.add(conn_of(m))
            self._out(m, Vote.frame(proposal))  # a vote it may give
        self._mark_status(now)
        self._update_established()

    def _arrive(self, node: int, round_number: int) -> None:
        self.book.arrive(node, round_number)
        self._open_exit_barrier_if_due()

    # ------------------------------------------------------------ decisions

    def hear(self, heard: Heard, now: float) -> None:
        """A node of this term heard of rounds of the job (``RoundBook.hear``). News decides
        again while a proposal is out: it may have to account for them (a member tells its
        news before its vote, ``FollowerSession.tell``; seed 50005902)."""
        if heard and self.book.hear(heard) and self.vote.current is not None:  # (a beat: none)
            self._decide(now)

    def accept_local(self, number: int, now: float) -> None:
        """The leader's own node recorded the proposal ``number`` (its state file is written)."""
        self.vote.accepted(self, self.claim.leader, number, now)

    # ------------------------------------------------------------ the vote (``_proposals``)

    def _decide(self, now: float) -> None:
        self.vote.decide(self, now)

    def _propose(self, form: Form, port: int, now: float) -> None:
        self.vote.propose(self, form, port, now)

    def needs_every_vote(self, number: int) -> bool:
        """Whether proposal ``number`` stands and forms only once every member voted."""
        return self.vote.needs_every_vote(number)

    def _update_established(self) -> None:
        if self.established:
            return
        if self.book.current is not None:
            self.established = True
            return
        own = self.own_history
        mine = (own.epoch, own.round, len(own.members)) if own and self.claim.leader in own.members else None
        lasts = list(self._support)
        if mine is not None:
            lasts.append(mine)
        if not lasts:
            return
        latest = max(lasts)
        # Members of that round that follow this term, us included.
        support = self._support[latest] + (latest == mine)
        if 2 * support > latest[2]:
            self.established = True
            log.info(
                "%s established: %d of the %d members of round %d follow this term",
                self.label,
                support,
                latest[2],
                latest[1],
            )

    # ------------------------------------------------------------ liveness

    def _sweep(self, now: float, *, beat: bool) -> None:
        """Drop the members silent past their bound (``hello_timeout_s`` before the hello,
        ``timeout_s`` after); with ``beat``, send the others a heartbeat.

        A member is dropped when its bound ends, not at the next beat after it (up to
        ``interval_s`` later): a bound that ends before the next beat gets a sweep of its own,
        at least ``interval_s / 10`` after this one, so that a thousand members whose bounds
        end one after another cost a few passes, not one each.
        """
        earliest: float | None = None
        for m in list(self.conns.values()):
            if m.node is None:
                due = m.opened + self.hello_timeout_s
                if now >= due:
                    self._close(m, f"no hello within {self.hello_timeout_s:g}s")
                    continue
            else:
                due = m.last_heard + self.beats.timeout_s
                if now >= due:
                    why = f"no heartbeat for {self.beats.timeout_s:g}s (frozen, cut off or too slow)"
                    self._send_record(m, Evicted(why))
                    self._drop(m, why, now, Evidence.SILENT)
                    continue
                if beat:
                    self._out(m, HB_FRAME, self._hb_digest)
                    self.counters.beats_out += 1
            earliest = due if earliest is None else min(earliest, due)
        if earliest is None or earliest >= self._next_beat:
            self._sweep_at = None
        else:
            self._sweep_at = max(earliest, now + self.beats.interval_s / 10)

    def _drop(self, m: Member, why: str, now: float, evidence: Evidence = Evidence.BROKEN) -> None:
        """Close ``m``'s connection: it broke the protocol, or (``evidence``) went silent."""
        self._close(m, why)
        if m.node is not None and self._forget(m):
            self._node_lost(m.node, why, now, votes=judge(evidence).votes)

    def _forget(self, m: Member, node: int | None = None) -> bool:
        """``m`` is no longer the member of its node (``node``: the one it was before it was
        superseded); False if it was not."""
        node = m.node if node is None else node
        if node is None or self._by_node.get(node) is not m:
            return False
        del self._by_node[node]
        m.join_deadline = None  # (a join it sent is no longer the node's: seed 10029097)
        self._count(m.last, -1)
        return True

    def _set_last(self, m: Member, last: tuple[int, int, int] | None) -> None:
        """The last round ``m`` reports, counted if it is its node's member."""
        counted = m.node is not None and self._by_node.get(m.node) is m
        if counted:
            self._count(m.last, -1)
        m.last = last
        if counted:
            self._count(last, 1)

    def _count(self, last: tuple[int, int, int] | None, delta: int) -> None:
        if last is not None:
            self._support[last] += delta
            if not self._support[last]:
                del self._support[last]

    def _node_lost(self, node: int, why: str, now: float, *, votes: bool) -> None:
        """``node`` is lost for the running round (``votes``: it keeps its vote, see ``_evidence``)."""
        if self.book.ledger.has_left(node):
            return
        if not votes:
            self.book.said_it_left(node, self.vote.voted_for(node))
        in_round = self.book.current is not None and node in self.book.current.member_set
        self.book.chronicle.lost(self.book.current, node, why, now)
        if in_round or node in self.book.pending:
            # Once the job is closed its members go, and a close can cross their last frames.
            level = logging.INFO if self.ended is not None else logging.WARNING
            log.log(level, "%s node %s is lost: %s", self.label, node_hex(node), why)
            self.on_event(Note("node_lost", f"removed node {node_hex(node)} from the rendezvous: {why}"))
        self.book.died(node, why)
        self._after_departure(now)
        self._decide(now)

    def _withdrawn(self, node: int, why: str, now: float) -> None:
        """A node that runs in no round of this term closed its connection itself, alive (it
        gave up waiting for our welcome under load, or follows another claim): its join is
        withdrawn, but it is not dead. It keeps its vote and its place among the last round's
        members the next round waits for (bounded by the last call), and when it comes back
        it is not held back as a node that was dropped (``rejoin_delay``)."""
        log.info("%s node %s withdrew: %s", self.label, node_hex(node), why)
        self.book.withdraw(node)
        self._after_departure(now)
        self._decide(now)

    def _after_departure(self, now: float) -> None:
        self._open_exit_barrier_if_due()
        self._mark_status(now)

    def _open_exit_barrier_if_due(self) -> None:
        rnd = self.book.current
        if rnd is None or self._barrier_opened >= rnd.number or not self.book.barrier_to_open():
            return
        self._barrier_opened = rnd.number
        gone = sorted(node_hex(n) for n in self.book.gone_from_barrier())
        log.info(
            "%s exit barrier of round %d opened: %d node(s) arrived, %d left or died (%s)",
            self.label,
            rnd.number,
            len(self.book.arrived),
            len(gone),
            " ".join(gone),
        )
        self._jobs.append(OpenExitBarrier(round=rnd.number, port=rnd.store_port))

    # ------------------------------------------------------------ helpers

    # What the vote asks of the joins (``_proposals``).

    def _answer(
        self, m: Member, kind: type[JoinAnswer], *, status_text: str | None = None, **fields: Any
    ) -> None:
        self.desk.answer(self, m, kind, status_text=status_text, **fields)

    def _send_members(self, m: Member, rnd: Round) -> None:
        self.desk.send_members(self, m, rnd)

    def _update_parking(self, now: float) -> None:
        self.desk.update_parking(self, now)

    def _may_join_next(self, m: Member) -> bool:
        return self.desk.may_join_next(self, m)

    def _offer_spare(self, m: Member) -> None:
        self.desk.offer_spare(self, m)

    def _mark_status(self, now: float) -> None:
        self.push.mark(now)
        self._now = now

    def _send_record(self, m: Member, frame: LeaderFrame) -> None:
        if m.conn is not None:
            self._out(m, frame.encode())

    def _out(self, m: Member, frame: bytes, digest: bytes | None = None) -> None:
        """Send ``frame`` to ``m`` (sealed with its connection's key, with a secret: ``Seal``;
        ``digest``: the frame's, computed once for a frame sent to many)."""
        if m.conn is None:
            return
        if m.seal is not None:
            if not m.seal.ready:
                return  # nothing but the challenge goes to a connection before its hello
            frame = m.seal.seal(frame, digest)
        self._frames.append((m.conn, frame))

    def _close(self, m: Member, why: str) -> None:
        if m.conn is not None and self.conns.pop(m.conn, None) is not None:
            self._closes.append((m.conn, why))
        self.door.passed(m)


def conn_of(m: Member) -> ConnId:
    assert m.conn is not None  # noqa: S101 - a follower's member has its connection
    return m.conn
