"""One node of a job: the driver that runs discovery, the leader's term and the follower's session.

How it works
------------
A ``Node`` owns the three protocol objects of one node: the election core
(``_protocol.Discovery``), the leader's term while it leads (``_leader.LeaderTerm``) and the
session with the leader while it follows (``_follower.FollowerSession``). It feeds them
what the shell reports (datagrams, connections, frames, finished jobs, the time) and turns
what they decide into calls on the shell's ``Net`` (send, connect, listen, submit a job).

The same ``Node`` runs in production, where ``_loop.Loop`` is its ``Net`` and drives it from
one thread over real sockets, and in ``testing.sim.Simulation``, which drives hundreds of them
over an in-memory network on a fake clock. Every method is called on the shell's thread.

The agent's thread never touches a ``Node``: it queues a request (``request_join``, ...)
with a ``Ticket`` and waits on the ``Board`` until the node resolves the ticket. Losing
the leader never leaves a waiter stuck: the node re-joins under the next leader by itself,
and every ticket carries a deadline.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from torch_mingle import _following as following
from torch_mingle import _leading as leading
from torch_mingle import _requests as requests
from torch_mingle._advice import Advice
from torch_mingle._ahead import StoreAhead, Target
from torch_mingle._ballot import Ballot, NodeState
from torch_mingle._claims import (
    BecomeLeader,
    Claim,
    Dest,
    LeaderFound,
    LeaderLost,
    LeaderView,
    Role,
    SteppedDown,
    Succession,
)
from torch_mingle._cuts import StoreCuts
from torch_mingle._errors import StateError
from torch_mingle._follower import (
    FollowerSession,
)
from torch_mingle._frames import (
    Ack,
    JoinAnswer,
)
from torch_mingle._jobs import Job, OpenClient, ReleaseStores
from torch_mingle._joining import Joining
from torch_mingle._keys import RoundKey
from torch_mingle._leader import LeaderTerm
from torch_mingle._notes import Note, Sink
from torch_mingle._protocol import RESIGNED, Discovery
from torch_mingle._ready import (
    ArriveRequested,
    CloseRequested,
    CodeFailed,
    Connected,
    ConnectionAccepted,
    ConnectionClosed,
    ConnectionInput,
    DatagramReceived,
    Extend,
    FramesReceived,
    HealthChecking,
    HealthJudged,
    Input,
    JoinRequested,
    LeaveRequested,
    Listening,
    ListenRefused,
    Ready,
    Resolve,
    Routes,
    ShutdownRequested,
    Started,
    StoreUnreachable,
    Ticket,
    TimerFired,
    WorkDone,
)
from torch_mingle._record import assert_never
from torch_mingle._records import Heard, History, JobEnd, Round, Status, heard_entry
from torch_mingle._requests import Requests
from torch_mingle._roles import Electing, Following, Leading, NodeRole
from torch_mingle._settings import NodeSettings
from torch_mingle._snapshot import Snapshots
from torch_mingle._view import Joined

log = logging.getLogger(__name__)

FLUSH_ROUNDS = 32


class Node:
    """Discovery, the leader's term and the follower's session of one node, driven by a shell."""

    def __init__(
        self,
        settings: NodeSettings,
        core: Discovery,
        routes: Routes,
        state: NodeState | None = None,
    ) -> None:
        self.settings = settings
        self.core = core
        self.routes = routes
        #: What the step under way decided (``step`` hands it over and starts the next).
        self._out = Ready()
        #: The inputs of a step after the one whose handling raised (``CodeFailed``).
        self._rest: list[Input] = []
        self._next_conn = 0
        #: What this node is to its job (``_roles``): the term or the session it holds.
        self.role: NodeRole = Electing()
        #: Its vote and what it must not forget (a predecessor's, after a restart: ``_identity``):
        #: each change goes into the step's ``Ready.state``, on the disk before anything leaves.
        self.ballot = Ballot.of(state, self._persist)
        core.hear(self.ballot.heard)  # what a predecessor heard of (``Ballot.remember``)
        if self.history is not None:
            core.hear_round(heard_entry(self.history.key, self.history.line))
        self.in_round: Round | None = None
        self.in_round_claim: Claim | None = None
        self.trouble: str | None = None
        self.job_closed = False
        self.saw_open = False
        self.recoveries = 0
        self.last_error: str | None = None
        #: The agent's join: its ticket, its answer and its deadline (``_joining``).
        self.joining = Joining()
        #: The agent's other requests: arrive, close, shutdown, leave (``_requests``).
        self.requests = Requests()
        #: The agent's connections to cut when its leader is lost or its round failed (``_cuts``).
        self.cuts = StoreCuts()
        #: The agent's client of the next round's store, opened ahead (``_ahead``).
        self.ahead = StoreAhead()
        #: Leaders of our last round that left the job (their ``bye`` said so): they no longer
        #: vote on the next round (sent with every join).
        self.gone: dict[int, RoundKey] = {}
        # A predecessor's terms (``_identity``): the election starts above them. (The round it
        # knows counts through ``history``; a proposal it accepted may never have formed.)
        for known in (self.history, self.accepted):
            if known is not None:
                core.max_epoch_seen = max(core.max_epoch_seen, known.epoch)
        core.max_epoch_seen = max(core.max_epoch_seen, self.ballot.led)
        self.term_tag = 0
        self._now = 0.0
        #: When it last published its snapshot, and what (``_snapshot``).
        self.snapshots = Snapshots()
        #: Its early words to the operator, each at its time (``_advice``).
        self.advice = Advice(settings)
        #: While ``step`` hands in the inputs of one wake-up: they are flushed together at its
        #: end (a new leader woken by a thousand hellos flushes once, not a thousand times).
        self._batching = False
        self._unflushed = False
        #: Called with every election event (tests and simulations record them).
        self.trace: Callable[[float, object], None] | None = None
        #: Called with every input as the node takes it (the simulator's causal bookkeeping).
        self.observe: Callable[[Input], None] | None = None
        #: Where the node's rendezvous events go (``_events``): the step's ``Ready.notes``.
        self.on_event: Sink = self._note
        #: Its health check fails (``set_unfit``): it leads no term.
        self.unfit = False

    @property
    def label(self) -> str:
        return self.settings.label

    @property
    def term(self) -> LeaderTerm | None:
        """The term this node leads (None: it does not lead)."""
        role = self.role
        return role.term if isinstance(role, Leading) else None

    @property
    def leading(self) -> LeaderTerm | None:
        """The term this node leads while its election still says so: within a step, the
        election may give the term up (a higher claim heard) before the node's flush ends it;
        what the term would do for the job then (a join, a close, an arrival, the snapshot's
        ``is_leader``) must not happen. The one place that reads both."""
        term = self.term
        return term if term is not None and self.core.role is Role.LEADING else None

    @property
    def session(self) -> FollowerSession | None:
        """Its session with the leader it follows (None: it follows none)."""
        role = self.role
        return role.session if isinstance(role, Following) else None

    @property
    def out(self) -> Ready:
        """What the step under way decided so far."""
        return self._out

    # ------------------------------------------------------------ the one input

    def step(self, inputs: Sequence[Input], now: float, *, wall_s: float | None = None) -> Ready:
        """Hand in what happened (in order), get what to do (``_ready``). The inputs of one
        step are flushed together at its end, but a datagram that changes who leads is
        flushed at once (see ``_on_datagram``). ``CodeFailed`` (the node's own code raised in
        the step before) recovers first, then takes the inputs that step did not get to.
        ``wall_s``: the wall clock now, where the shell follows it (what signed datagrams
        carry: a clock that steps, as NTP does, moves with it)."""
        if wall_s is not None:
            self.core.wall_offset_s = wall_s - now
        if inputs and isinstance(inputs[0], CodeFailed):
            inputs = [inputs[0], *self._rest]
        self._batching = True
        try:
            for index, event in enumerate(inputs):
                self._rest = list(inputs[index + 1 :])
                if self.observe is not None:
                    self.observe(event)
                self._handle(event, now)
            self._rest = []
            self._batching = False
            if self._unflushed:
                self.flush(now)
        finally:
            self._batching = False
        ready, self._out = self._out, Ready()
        ready.timer = self.next_timer()
        return ready

    def _handle(self, event: Input, now: float) -> None:
        match event:
            case DatagramReceived(data=data, addr=addr):
                self._on_datagram(data, addr, now)
            case ConnectionAccepted() | Connected() | FramesReceived() | ConnectionClosed():
                self._role_step(event, now)
            case WorkDone(job=job, tag=tag, result=result, error=error):
                self._on_work_done(job, tag, result, error, now)
            case TimerFired():
                self._on_timer(now)
            case Listening(port=port):
                self._start_term(port, now)
            case ListenRefused(why=why):
                leading.cannot_lead(self, why, now)
            case Started():
                self._start(now)
            case CodeFailed(exc=exc):
                self._recover(exc, now)
            case JoinRequested(ticket=ticket):
                self._request_join(ticket, now)
            case ArriveRequested(ticket=ticket, round_number=number):
                requests.arrive(self, ticket, number, now)
            case CloseRequested(end=end):
                requests.close(self, end, now)
            case ShutdownRequested(ticket=ticket, close_timeout_s=timeout_s, end=end):
                self._request_shutdown(ticket, timeout_s, end, now)
            case LeaveRequested(ticket=ticket):
                self._request_leave(ticket, now)
            case HealthChecking(running=running):
                self._set_checking(running, now)
            case HealthJudged(unfit=unfit):
                self._set_unfit(unfit, now)
            case StoreUnreachable(claim=claim, why=why):
                self._report_unreachable(claim, why, now)
            case _:
                assert_never(event)

    def _start(self, now: float) -> None:
        self.advice.started(now)
        self.core.start(now)
        self.flush(now)

    def _on_datagram(self, data: bytes, addr: Dest, now: float) -> None:
        # A datagram may change who leads: what came before it in this wake-up is flushed
        # first, and what it changed at once (a term overtaken must not take the frames that
        # follow; a session replaced must not lose the round it was just sent).
        if self._unflushed:
            self.flush(now)
        self.core.receive_datagram(data, addr, now)
        self.advice.heard(self)
        if self.core.has_events():
            self.flush(now)
        else:
            self._flushed_later(now)

    def _role_step(self, event: ConnectionInput, now: float) -> None:
        """A connection's input goes to the role that holds it: chosen here, once (``_roles``)."""
        match self.role:
            case Leading(term=term):
                changed = leading.step(term, event, now)
            case Following(session=session):
                changed = following.step(self, session, event, now)
            case Electing():
                if isinstance(event, ConnectionAccepted):
                    self._out.close(event.conn)  # no term: nothing of this node listens for it
                changed = not isinstance(event, ConnectionAccepted | Connected)
        if changed:
            self._flushed_later(now)

    def _on_work_done(self, job: Job, tag: int, result: object, error: str | None, now: float) -> None:
        if isinstance(job, OpenClient):
            self.ahead.opened(tag, result, error)
        elif self.term is not None and tag == self.term_tag:
            self.term.job_done(job, result, error, now)
        elif isinstance(result, int) and error is None and not isinstance(job, ReleaseStores):
            self._out.submit(ReleaseStores(ports=(result,)), tag)  # a store for a term that ended
        self._flushed_later(now)

    def _flushed_later(self, now: float) -> None:
        if self._batching:
            self._unflushed = True
        else:
            self.flush(now)

    def _on_timer(self, now: float) -> None:
        timer = self.core.next_timer()
        if timer is not None and now >= timer:
            self.core.handle_timer(now)
        if self.term is not None:
            timer = self.term.next_timer()
            if timer is not None and now >= timer:
                self.term.handle_timer(now)
        if self.session is not None:
            timer = self.session.next_timer()
            if timer is not None and now >= timer:
                self.session.handle_timer(now)
        requests.expire(self, now)
        requests.leaving_deadline(self, now)
        if self.advice.due(self, now, unfit=self.unfit):
            self._set_unfit(True, now)
        self.flush(now)

    def next_timer(self) -> float | None:
        times = [
            self.core.next_timer(),
            self.term.next_timer() if self.term is not None else None,
            self.session.next_timer() if self.session is not None else None,
            self.advice.next_timer(unfit=self.unfit),
            join.due if (join := self.joining.open()) is not None else None,
            self.requests.next_timer(),
        ]
        present = [t for t in times if t is not None]
        return min(present) if present else None

    def _recover(self, exc: BaseException, now: float) -> None:
        """An unexpected error in this node's code: a leader resigns, a follower re-joins."""
        self.recoveries += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        view = self.core.leader
        if self.term is not None or self.core.role in (Role.CLAIMING, Role.LEADING):
            log.error("%s resigning as leader after an internal error: %s", self.label, self.last_error)
            self.unlead(f"the leader resigned after an internal error ({self.last_error})", now)
            self.core.abandon(now)
        elif view is not None and not view.is_self:
            # A fresh session with the same leader (it did nothing wrong); also when the error
            # struck between finding the leader and connecting to it.
            log.error("%s joining the leader again after an internal error: %s", self.label, self.last_error)
            following.end_session(self)
            following.connect(self, view, now)
        self.flush(now)

    # ------------------------------------------------------------ requests

    def _request_join(self, ticket: Ticket, now: float) -> None:
        """The agent asks for a place in the next round (``next_rendezvous``)."""
        self.advice.join_requested(now)
        self.joining.asked(self, ticket, now)
        self.flush(now)

    def alone(self) -> bool:
        """Whether this node is cut off from its job as far as it can tell: it heard no other
        node, or it follows no leader, or it leads one that nobody follows (``_slurm``)."""
        if not self.core.peers:
            return True
        if self.term is not None:
            return self.term.connected_nodes() == 0
        return self.session is None or not self.session.ready

    def _set_checking(self, checking: bool, now: float) -> None:
        """The node's health check starts (or ended) before a join. The members' next round
        waits for its leader's join: a check that runs longer than the heartbeat timeout, on a
        node of a job that has other nodes, makes it unfit meanwhile (it gives up its term, so
        another node leads), as a failing one does. A short check costs the others nothing."""
        self.advice.checking(checking, now)
        self.flush(now)

    def _set_unfit(self, unfit: bool, now: float) -> None:
        """The node's health check failed (``unfit``) or passed again. An unfit node leads no
        term: a leader gives its term up (the others elect another, and form their round
        without this node), and it abandons any claim it wins until it is fit again."""
        self.unfit = unfit
        if unfit and self.term is not None:
            self.unlead("this node's health check failed", now)
            self.core.abandon(now)
        self.flush(now)

    def _report_unreachable(self, claim: Claim, why: str, now: float) -> None:
        """The agent could not reach the round's store: treat the leader as lost by silence."""
        if self.session is not None and self.session.claim == claim:
            following.end_session(self)
            self.core.leader_failed(now, claim, why)
        self.flush(now)

    # ------------------------------------------------------------ flush

    def flush(self, now: float) -> None:
        """Hand what the protocol objects decided to the shell, until nothing is left."""
        self._now = now
        self._unflushed = False
        for _ in range(FLUSH_ROUNDS):
            busy = False
            for data, dest in self.core.datagrams_to_send(now):
                self._out.send_datagram(data, dest)
            for ev in self.core.events():
                busy = True
                self._core_event(ev, now)
            term = self.term
            if term is not None:
                busy |= leading.flush_term(self, term, now)
            session = self.session
            if session is not None:
                session.tell(self.heard())  # news goes to the leader at once
                for frame in session.frames():
                    self._out.send(session.conn, frame)
                for sev in session.events():
                    busy = True
                    following.session_event(self, session, sev, now)
            if self.shutting_down() and self.term is not None:
                requests.finish_shutdown(self, now)
            requests.check_leaving(self, now)
            if not busy:
                break
        self.joining.remember_heard(self)
        self._connect_ahead()
        self._publish(now, force=self.joining.answered is not None)
        self.joining.hand_over(self)
        # After the publish: the agent, cut loose, reads why.
        own_ip = self.settings.connect_ip if self.term is not None else None
        self.cuts.round_failed(self._out, self.in_round, self.status(now), own_ip)

    def leaving(self) -> bool:
        """The agent asked to leave (a preemption notice) and the node has not finished yet."""
        leaving = self.requests.leaving
        return leaving is not None and not leaving.decided

    def shutting_down(self) -> bool:
        """The agent shuts down (``shutdown()``) and the node has not finished yet."""
        shutdown = self.requests.shutdown
        return shutdown is not None and not shutdown.decided

    def waits_for_a_round(self) -> bool:
        """The agent's join waits for an answer."""
        return self.joining.open() is not None

    def describe_network(self) -> str:
        return self.routes.describe()

    def _connect_ahead(self) -> None:
        """Unless the leader parked this node, open the agent's client of the store the next
        round will use: while its join waits, before its first, and while it runs in a round
        (the next one follows a failure, and then every member joins at once).

        The leader names that store as soon as it is open (``spare_port``, ``next``), so when
        the round forms, every agent returns at once instead of N agents connecting then.
        The client is used only if the round is formed on that very store by that claim;
        otherwise it is dropped, and a connect to a lost leader is cut (``_leader_lost``).
        """
        target: Target | None = None
        term, session = self.leading, self.session
        if not self.joining.parked:
            if term is not None and term.spare_port is not None:
                target = (term.claim, None, term.spare_port)
            elif session is not None and session.ready and session.next_store_port is not None:
                target = (session.claim, session.ip, session.next_store_port)
        start = self.ahead.aim(target)
        if start is not None:
            self._out.submit(*start)

    # ------------------------------------------------------------ requests (``_requests``)

    def _request_shutdown(self, ticket: Ticket, close_timeout_s: float, end: JobEnd, now: float) -> None:
        requests.shutdown(self, ticket, close_timeout_s, end, now)

    def _request_leave(self, ticket: Ticket, now: float) -> None:
        requests.leave(self, ticket, now)

    def deliver_close(self, now: float) -> None:
        requests.deliver_close(self, now)

    # ------------------------------------------------------------ the leading role (``_leading``)

    def _lead(self, epoch: int, now: float) -> None:
        leading.lead(self, epoch, now)

    def _start_term(self, port: int, now: float) -> None:
        leading.start_term(self, port, now)

    def unlead(self, why: str, now: float, *, leaving: bool = False) -> None:
        leading.unlead(self, why, now, leaving=leaving)

    # ------------------------------------------------------------ election events

    def _core_event(self, ev: object, now: float) -> None:
        if self.trace is not None:
            self.trace(now, ev)
        if isinstance(ev, BecomeLeader):
            self._lead(ev.epoch, now)
        elif isinstance(ev, SteppedDown):
            # Routine when nodes start together (two claims, one wins); news once the term led a job.
            level = logging.WARNING if self.term is not None and self.term.established else logging.INFO
            log.log(level, "%s stepping down: %s beats our %s", self.label, ev.winner, ev.own)
            self.on_event(Note("stepped_down", f"stepped down as leader: {ev.winner} beats {ev.own}"))
            self.unlead(f"this node stepped down as leader ({ev.winner} beats {ev.own})", now)
        elif isinstance(ev, LeaderFound):
            self._leader_found(ev.leader, now)
        elif isinstance(ev, LeaderLost):
            level = logging.INFO if ev.reason == RESIGNED else logging.WARNING
            log.log(level, "%s lost leader %s: %s; electing again", self.label, ev.claim, ev.reason)
            self._leader_lost(ev.claim, ev.reason, now)

    def _leader_found(self, view: LeaderView, now: float) -> None:
        who = "this node" if view.is_self else view.store_ip
        log.info("%s leader: %s (%s), control port %d", self.label, who, view.claim, view.store_port)
        if not view.is_self:
            self.on_event(Note("leader_found", f"follows the leader {who} (epoch {view.claim.epoch})"))
        if view.closed and not view.is_self:
            said = "failed" if view.failed else "finished"
            self.job_closed_seen(JobEnd(f"its leader announces that the job {said}", failed=view.failed))
            if self.core.role is not Role.FOLLOWING:
                return  # it left (its shutdown waited only to hear that the job closed)
            # It follows that leader all the same: its session is what notices that it went
            # silent (the one owner of a leader's silence), as for any other leader.
        if view.is_self:
            if not view.closed:
                self.saw_open = True
            self.deliver_close(now)
            if self.joining.open() is not None:
                self.joining.send(self, now)
            return
        old = self.session.claim if self.session is not None else None
        if old is not None and old != view.claim:
            # A better claim won while our leader still answered (we heard it later than the
            # others, who followed its successor): its round is over for us too, as if lost.
            ours = self.in_round_claim == old  # else an election race before our round: routine
            log.log(
                logging.WARNING if ours else logging.INFO,
                "%s leader %s overtaken by %s",
                self.label,
                old,
                view.claim,
            )
            self._leader_lost(old, f"overtaken by {view.claim}", now)
        following.end_session(self)
        following.connect(self, view, now)

    def _leader_lost(self, claim: Claim, reason: str, now: float) -> None:
        self.on_event(Note("leader_lost", f"lost the leader {claim}: {reason}; electing again"))
        if self.session is not None and self.session.claim == claim:
            following.end_session(self)
        if self.in_round_claim == claim:
            self.trouble = f"leader {claim} lost: {reason}"
            # Published before the cut: an agent woken by it must read that its round is over,
            # or it would try the frozen store again, and block there.
            self._publish(now)
            if self.in_round is not None:
                self.cuts.leader_lost(self._out, claim)
        for ip, port in self.ahead.toward(claim):
            # A connect ahead to the lost leader; not ended: if the same leader speaks again
            # (it was only silent), its next round may use that store.
            self._out.abort_connections_to(ip, [port])
        join = self.joining.open()
        if join is not None and join.due is None:
            self.joining.set_due(self, join, now + join.timeout_s)  # no longer parked

    # ------------------------------------------------------------ session events

    def _persist(self, state: NodeState) -> None:
        """The ballot changed: its state goes to the disk before anything of this step leaves."""
        self._out.state = state

    def connect_to(self, ip: str, port: int) -> int:
        """Open a connection; its id is the node's own (negative: the shell numbers those it
        accepts from 1)."""
        self._next_conn -= 1
        self._out.connect(self._next_conn, ip, port)
        return self._next_conn

    def _note(self, note: Note) -> None:
        self._out.notes.append(note)

    def resolve(self, ticket: Ticket, result: object = None, error: BaseException | None = None) -> None:
        """Answer the agent's ``ticket`` (once: a later answer is dropped, as the board does)."""
        if ticket.decided:
            return
        ticket.decided = True
        self._out.answers.append(Resolve(ticket, result, error))

    def extend(self, ticket: Ticket, due: float | None) -> None:
        """The node gives up on ``ticket`` at ``due`` now (None: parked), and so does the agent."""
        ticket.due = due
        self._out.answers.append(Extend(ticket, due))

    @property
    def history(self) -> History | None:
        """The newest round this node knows formed (``Ballot``)."""
        return self.ballot.history

    @property
    def accepted(self) -> History | None:
        """The newest proposal this node accepted, newer than ``history``: its vote (``Ballot``)."""
        return self.ballot.accepted

    def own_key(self) -> RoundKey | None:
        """The newest round this node was in or voted for: where its departure counts."""
        return self.ballot.own_key()

    def vote(self, rnd: Round, base: int, covers: frozenset[tuple[int, int, int]]) -> bool:
        """Record the proposal ``rnd`` as this node's vote, if it accounts for what the node
        knows (``Ballot.accept``: on the disk before the vote goes out)."""
        if self.ballot.accept(rnd, base, covers, self.heard()):
            return True
        log.info(
            "%s not accepting round %d of epoch %d: it does not account for %s / %s, it left, or no disk",
            self.label, rnd.number, rnd.epoch, self.history, self.accepted,
        )  # fmt: skip
        return False

    def answer(self, answer: JoinAnswer | Ack, session: FollowerSession | None, now: float) -> None:
        """The leader's answer to the agent's join or arrive (its own term's, or by ``session``)."""
        if isinstance(answer, Ack):
            requests.acked(self, answer.ticket)
            return
        self.joining.answer(self, answer, session, now)

    def joined(self, rnd: Round, session: FollowerSession | None) -> None:
        """The round ``rnd`` answered this node's join: it is a member."""
        claim = session.claim if session is not None else Claim(rnd.epoch, self.settings.node_id)
        if rnd.rank_of(self.settings.node_id) is None:
            raise StateError(f"{self.label} round {rnd.number} was sent to us but does not list us")
        self.core.hear_round(heard_entry(rnd.key, rnd.lines[0] if rnd.lines else None))
        self.ballot.formed(rnd, self.heard())
        self.gone = {n: k for n, k in self.gone.items() if n in rnd.member_set}
        self.in_round, self.in_round_claim, self.trouble = rnd, claim, None
        seen_via = session.ip if session else self.settings.advertised_ip
        self.core.set_succession(
            Succession(claim, rnd.number, rnd.members, rnd.ips, rnd.dports, seen_via=seen_via)
        )
        self.joining.parked = False  # a member now (a spare admitted without a "wait" frame saying so)
        if session is not None:
            self.cuts.joined(claim, session.ip, rnd.store_port)
        leader_ip = session.ip if session is not None else None
        client = self.ahead.take(claim, rnd.store_port)
        self.joining.decided(Joined(rnd, claim, leader_ip, client))

    # ------------------------------------------------------------ helpers

    def heard(self) -> Heard:
        """The rounds of the job this node heard of, by any authentic word."""
        return self.core.heard

    def job_closed_seen(self, end: JobEnd) -> None:
        self.job_closed = True
        self.joining.closed(self, end, self._now)
        if self.shutting_down() and self.term is None:
            self.requests.pending_close = None  # closed already: nothing left to tell
            requests.leave_for_good(self, self._now)

    def _failure(self, now: float) -> str:
        """Why the job failed, if its leader says so (closed because a round could not start)."""
        status = self.status(now)
        return status.failure if status is not None else ""

    def nodes_waiting(self, now: float) -> int:
        """What ``num_nodes_waiting()`` answers: > 0 also when this node's round cannot go on."""
        return self.snapshots.round_state(self, self.status(now))[1]

    def status(self, now: float) -> Status | None:
        """The job's status as this node's leader tells it (its own term's, leading)."""
        if self.term is not None:
            return self.term.status(now)
        if self.session is not None:
            return self.session.status
        return None

    def _publish(self, now: float, *, force: bool = False) -> None:
        self.snapshots.publish(self, now, force=force)
