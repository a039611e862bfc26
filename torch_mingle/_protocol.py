"""Discovery and leader election for one job, without I/O.

How it works
------------
Every node of a job runs one ``Discovery``. Time comes in as ``now`` (seconds, any
monotonic origin); datagrams come in through ``receive_datagram`` and go out through
``datagrams_to_send``; the caller asks ``next_timer()`` and calls ``handle_timer(now)``.
Decisions come out as events (``BecomeLeader``, ``LeaderFound``, ``LeaderLost``,
``SteppedDown``). Nothing here touches a socket, a thread or the clock, so a test can
run hundreds of nodes on a fake network in milliseconds.

* A starting node multicasts ``QUERY`` ("who leads job J?") at once in a small job, after
  a short random delay (``startup_jitter_s``) in a large one, and retries with backoff. A
  leader answers at once with ``ANNOUNCE`` (unicast to the asker, and multicast,
  rate-limited), so a late joiner adopts the existing leader in one round trip. A node
  that, before its first query, already heard a better candidate (one that knows at least
  its epoch) stays silent: when thousands start together only a handful speak.
* If no leader answers within ``election_window_s`` (or once every node the job can have,
  ``expected_nodes``, has been heard: nobody is left to wait for), the nodes that heard each
  other's queries pick the lowest node id among the candidates heard. That node claims
  leadership with ``epoch = highest epoch seen + 1``; the others wait ``claim_wait_s``
  for its announcement, then suspect it and decide again.
* Claims are ordered by *standing*: an **established** claim (its leader formed a round in
  its term, or a majority of the last round's members follow it) beats any claim that is
  not; then the higher epoch wins; then the claim more nodes follow (control connections,
  rounded down to a power of two, carried in the announcement); then the lower node id.
  A leader that hears a better claim steps down; a follower switches to a better claim.
  So a late joiner that heard nothing, or a node that was cut off and elected itself,
  never deposes a leader whose job runs: its bare claim is not established, whatever its
  epoch; and before the first round (nothing is established yet) a newcomer whose answer
  came late claims the same epoch as the running leader, which its followers outweigh (and a
  member of a round knows its leader is established before any announcement says so). A
  node that suspected a live leader still wins with its higher epoch, so a false suspicion never
  strands it alone.
* Losing a leader, by any evidence (it resigned, it said ``bye``, it rejected our claim; or
  silence, a connection closed, reset or refused, which a partition produces as well), only
  *suspects* its claim for ``suspect_ttl_s``: if it speaks again later it was alive all along,
  and it may be followed once more if nothing better is known. A leader that gave a claim up
  never announces it again, so its word needs no more than that.
* Epochs are bounded: a datagram whose epoch is more than ``MAX_EPOCH_STEP`` above
  everything this node knows is dropped, so forged datagrams cannot exhaust the epoch space.
"""

from __future__ import annotations

import logging
import random
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from torch_mingle._claims import (
    DROP_MEANINGS,
    OTHER_SECRETS,
    QUIET_REASONS,
    BecomeLeader,
    Claim,
    Dest,
    Event,
    LeaderFound,
    LeaderLost,
    LeaderView,
    PeerInfo,
    Role,
    Stats,
    SteppedDown,
    Succession,
    Timing,
    announced_store_ip,
    standing_of,
    standing_of_body,
)
from torch_mingle._errors import StateError
from torch_mingle._record import replace
from torch_mingle._records import NOTHING_HEARD, Entry, Heard
from torch_mingle._wire import (
    EPOCH_MAX,
    Announce,
    Codec,
    Datagram,
    Invalid,
    MsgType,
    Probe,
    Query,
    Resign,
    with_scope_of,
)

log = logging.getLogger(__name__)


MAX_PEERS = 4096
MAX_OTHER_JOBS = 32
MAX_CANDIDATES = 4096
MAX_SUSPECTS = 256
#: How far above everything it knows a node believes an epoch: far more leader changes
#: than any job sees, far fewer than the 2**62 epochs there are.
MAX_EPOCH_STEP = 2**20
#: Jobs of at most this many nodes: every node queries once, so the election ends as soon as
#: all have spoken; larger ones keep quiet when a better candidate already spoke (no storms).
SPEAK_ALL_UP_TO = 64
INVALID_LOG_INTERVAL_S = 60.0
RESIGNED = "the leader resigned"
PROBE_RATE_PER_S = 20.0
#: A spare that lost a running round's leader claims only after this many successor waits.
SPARE_HOLD_SUCCESSORS = 3
PROBE_BURST = 20


_Handler = Callable[["Discovery", Datagram, Dest, float], None]


class Discovery:
    """The discovery/election state machine of one node in one job."""

    def __init__(
        self,
        job: str,
        node_id: int,
        *,
        timing: Timing | None = None,
        codec: Codec | None = None,
        addrs: tuple[str, ...] = (),
        wall_offset_s: float = 0.0,
        rng: random.Random | None = None,
        expected_nodes: int = 0,
    ) -> None:
        if not 0 < node_id < 2**64:
            raise ValueError(f"node id must be a non-zero 64-bit integer, got {node_id}")
        self.job = job
        self.node_id = node_id
        self.timing = timing or Timing()
        self.codec = codec or Codec()
        self.addrs = addrs
        #: Wall clock minus ``now``: the shell refreshes it, so a clock step (NTP) is followed.
        self.wall_offset_s = wall_offset_s
        self._rng = rng or random.Random()
        #: ``max_nodes``: once that many candidates are heard, the election window may end early.
        self.expected_nodes = expected_nodes
        self.role = Role.IDLE
        self.leader: LeaderView | None = None
        self.max_epoch_seen = 0
        #: The rounds of this job this node heard of: one it was in, or one any authentic word
        #: named (an announcement or a query, one outside the replay window too; the shell adds
        #: what its leader's frames said): a round of the job ran, so this node must not found a
        #: job of its own, nor go on beside it (``OtherTerms.unaccounted``); its queries say so.
        self.heard: Heard = NOTHING_HEARD
        self.stats = Stats()
        self.peers: OrderedDict[int, PeerInfo] = OrderedDict()
        self._own_claim: Claim | None = None
        self._store: tuple[str, int] | None = None
        # Placeholder address and epoch until leader_ready() fills them in.
        self._status = Announce(epoch=1, store_ip="127.0.0.1", store_port=1)
        self._candidates: dict[int, tuple[float, int]] = {}  # node -> (heard at, its epoch seen)
        self._queried = False
        self._suspects: dict[int, float] = {}  # candidates that did not claim, until when
        # Claims heard announced (most recent last): only those can be resigned (a forged
        # resignation of a claim nobody made yet must not suspect it in advance).
        self._heard_claims: OrderedDict[Claim, None] = OrderedDict()
        self._suspected_claims: OrderedDict[Claim, float] = OrderedDict()  # lost claims, until when
        self._awaiting: tuple[int, float] | None = None
        self._next_query = 0.0
        self._query_gap = self.timing.query_retry_s
        self._election_deadline = 0.0
        self._next_announce = 0.0
        self._burst_left: list[float] = []
        self._succession_set: frozenset[int] | None = None
        #: Members of the round we took over, told by unicast at ``_fanout_at`` unless they follow.
        self._fanout: list[tuple[int, Dest]] = []
        self._fanout_at = 0.0
        self._follows: Callable[[int], bool] | None = None
        self._last_mcast_announce = float("-inf")
        self._outbox: list[tuple[bytes, Dest]] = []
        self._events: list[Event] = []
        self._invalid_logged_at: dict[str, float] = {}
        self._probe_tokens = float(PROBE_BURST)
        self._probe_refill = 0.0
        self._hold_claims_until = float("-inf")
        self.succession: Succession | None = None
        #: Leaders of the succession's members lost since it was set: passed over in rank order.
        self._passed: set[int] = set()
        #: Electing by succession: our leader was lost, and we know the round it led.
        self._by_succession = False

    # ----------------------------------------------------------------- inputs

    def start(self, now: float) -> None:
        if self.role is not Role.IDLE:
            raise StateError(f"start() in role {self.role.value}: discovery was already started")
        self._enter_discovery(now)

    def receive_datagram(self, data: bytes, addr: Dest, now: float) -> None:
        self.stats.received += 1
        dgram = self.codec.decode(data, wall_ms=self._wall_ms(now))
        if isinstance(dgram, Invalid):
            if dgram.stale is not None:
                self._hear_round(dgram.stale)
            if dgram.job == self.job:
                self.stats.invalid_of_job[dgram.reason] += 1
            elif dgram.job is not None and dgram.reason in OTHER_SECRETS:
                # Another job's, signed its own way (or ``doctor``'s): no fault of this job's.
                self._count_other_job(dgram.job)
                return
            _count_invalid(self, dgram.reason, addr, now)
            return
        if dgram.sender == self.node_id:
            return  # our own multicast, looped back (or a forgery in our name)
        if isinstance(dgram.body, Probe):
            self._answer_probe(addr, now)
            return
        if dgram.job != self.job:
            self._count_other_job(dgram.job)
            return
        if self._epoch_of(dgram) > self._epoch_ceiling():
            _count_invalid(self, "epoch_jump", addr, now)
            return
        self.stats.accepted += 1
        self._hear_round(dgram)
        self._note_peer(dgram, addr, now)
        handler = _TRANSITIONS.get((self.role, dgram.body.type))
        if handler is None:
            raise StateError(f"no transition for a {dgram.body.type.name} datagram in role {self.role.value}")
        handler(self, dgram, addr, now)

    def _hear_round(self, dgram: Datagram) -> None:
        """An authentic datagram of this job names a round that ran: remember the highest."""
        if dgram.job != self.job:
            return
        if isinstance(dgram.body, (Announce, Resign)):
            self.hear_round(*dgram.body.heard)
        elif isinstance(dgram.body, Query):
            self.hear_round(*dgram.body.round_seen)

    def hear_round(self, *keys: Entry | None) -> None:
        """Rounds ``keys`` of the job ran (the node heard of them, by any authentic word)."""
        self.heard = self.heard.with_keys(*keys)

    def hear(self, heard: Heard) -> None:
        self.heard = self.heard.with_heard(heard)

    def handle_timer(self, now: float) -> None:
        if self.role is Role.DISCOVERING:
            if now >= self._next_query:
                self._send_query(now)
            if now >= self._election_deadline:
                if self._awaiting is not None and now >= self._awaiting[1] and not self._queried:
                    # We stayed silent for a better candidate that never claimed: ask before suspecting.
                    self._emit_query(now)
                    self._awaiting = (self._awaiting[0], now + self.timing.claim_wait_s)
                    self._election_deadline = self._awaiting[1]
                elif self._awaiting is not None and now >= self._awaiting[1]:
                    suspect = self._awaiting[0]
                    log.debug(
                        "[%s %016x] candidate %016x did not claim within %.3fs; suspecting it",
                        self.job,
                        self.node_id,
                        suspect,
                        self.timing.claim_wait_s,
                    )
                    self._suspect(suspect, now)
                    self._candidates.pop(suspect, None)
                    self._awaiting = None
                    if self._by_succession:
                        # Passed over for good (until a new round): were it only suspected, its
                        # suspicion could end before the members behind it, dead too, are all
                        # passed, and the wait would go round in circles. If it claims later,
                        # its announcement is still followed.
                        self._passed.add(suspect)
                self._decide(now)
        elif self.role is Role.LEADING:
            if now >= self._next_announce:
                self._send_announce(None, now)
                self._schedule_announce(now)
            if self._fanout and now >= self._fanout_at:
                follows = self._follows
                dests = [dest for node, dest in self._fanout if follows is None or not follows(node)]
                self._fanout, self._follows = [], None
                if dests:
                    self._emit(self._status, dests, now)  # one encoding for them all

    def leader_ready(
        self, now: float, store_ip: str, store_port: int, follows: Callable[[int], bool] | None = None
    ) -> bool:
        """The shell hosts the store for our claim; returns False if the claim was overtaken.

        ``follows(node)``: whether a node is connected to our term (the shell's word), so that
        the members of a round we take over are told by unicast only if they need it.
        """
        if self.role is not Role.CLAIMING or self._own_claim is None:
            return False
        self.role = Role.LEADING
        self._store = (store_ip, store_port)
        self._status = replace(
            self._status, epoch=self._own_claim.epoch, store_ip=store_ip, store_port=store_port
        )
        self.leader = self._own_view(now)
        # A burst of announcements for nodes that missed the first; not when we take over our
        # round: its members also get one by unicast, and ask us again if they miss both.
        self._burst_left = [] if self._by_succession else list(self.timing.announce_burst_s)
        self._send_announce(None, now)
        if self._by_succession and self.succession is not None:
            # The round we took over: each member that does not follow us soon gets the
            # announcement by unicast, so that it re-forms where multicast has stopped (a
            # snooping switch that forgot the group). Not at once to all: where multicast
            # works they follow within the delay, and a thousand datagrams would wake each
            # member a second time while we have their hellos to answer.
            self._fanout = [
                (node, dest)
                for node, dest in self.succession.dests()
                if dest is not None and node != self.node_id and node not in self._passed
            ]
            self._fanout_at = now + self.timing.fanout_delay_s
            self._follows = follows
            self._by_succession = False
        self._schedule_announce(now)
        self._events.append(LeaderFound(self.leader))
        return True

    def update_status(
        self,
        now: float,
        *,
        round: int,
        members: int,
        closed: bool,
        failed: bool = False,
        min_nodes: int,
        max_nodes: int,
        established: bool,
        followers: int = 0,
        heard: Heard = NOTHING_HEARD,
    ) -> None:
        """The leader's job state, carried in its announcements; announces a change soon.
        ``heard``: the rounds of the job it knows ran (``RoundBook.highest_heard``)."""
        new = replace(
            self._status,
            round=round,
            heard=heard.entries(),
            members=members,
            closed=closed,
            failed=failed,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            established=established,
            # Rounded down to a power of two: announced again when it doubles, not per node.
            followers=1 << (followers.bit_length() - 1) if followers > 0 else 0,
        )
        if new == self._status:
            return
        self._status = new
        if self.role is Role.LEADING:
            self.leader = self._own_view(now)
            # Soon, but one multicast per ``query_mcast_gap_s`` at most: a new leader's status
            # changes a dozen times while a thousand members follow it (their count doubles),
            # and every announcement wakes every node of the group.
            soon = max(
                now + self.timing.announce_min_gap_s,
                self._last_mcast_announce + self.timing.query_mcast_gap_s,
            )
            self._next_announce = min(self._next_announce, soon)

    def leader_failed(self, now: float, claim: Claim, reason: str) -> None:
        """The shell lost ``claim``'s leader, whatever it saw: the claim is suspected for
        ``suspect_ttl_s`` (it may speak again; one it gave up it never announces again)."""
        if claim.leader == self.node_id:
            return  # we know we are alive; our own store failing is the shell's business
        self._suspect_claim(claim, now)
        if self.role is Role.FOLLOWING and self.leader is not None and self.leader.claim == claim:
            self._lose_leader(now, reason)

    def set_succession(self, succession: Succession) -> None:
        """The round this node is in now: if its leader is lost, the members take over in its
        rank order (the next member claims, the others wait for it and ask it by unicast)."""
        self.succession = succession
        self._succession_set = None
        self._passed = set()

    def abandon(self, now: float) -> None:
        """Give up our own claim (the shell cannot host the term): resign it, let another node lead."""
        if self.role is Role.LEADING and self._own_claim is not None:
            self._emit(self._resignation(self._own_claim), None, now)
        if self.role in (Role.CLAIMING, Role.LEADING):
            self._hold_claims_until = now + self.timing.suspect_ttl_s
            self._enter_discovery(now)

    def give_way(self, now: float, epoch: int) -> None:
        """Our term learnt that a term of ``epoch`` (at least ours) formed or proposed a round:
        resign, and elect again above it (a claim of ours now would have a lower epoch)."""
        self.max_epoch_seen = max(self.max_epoch_seen, epoch)
        if self.role is Role.LEADING and self._own_claim is not None:
            self._emit(self._resignation(self._own_claim), None, now)
        if self.role in (Role.CLAIMING, Role.LEADING):
            self._enter_discovery(now)

    def _resignation(self, claim: Claim) -> Resign:
        """The resignation of our term ``claim``: it says the rounds this node heard of and
        those its term knew of (its status: a leader's own rounds), so that a node whose only
        word of the job it is still knows that the job ran, and which round (seed 62014562)."""
        return Resign(epoch=claim.epoch, heard=self.heard.with_keys(*self._status.heard).entries())

    def resign(self, now: float) -> None:
        """Stop leading (shutdown): tell the followers so they do not wait for a timeout."""
        if self.role is Role.LEADING and self._own_claim is not None:
            self._emit(self._resignation(self._own_claim), None, now)
        self.stop()

    def stop(self) -> None:
        self.role = Role.STOPPED
        self.leader = None

    # ---------------------------------------------------------------- outputs

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Dest]]:
        out, self._outbox = self._outbox, []
        return out

    def events(self) -> list[Event]:
        out, self._events = self._events, []
        return out

    def has_events(self) -> bool:
        return bool(self._events)

    def next_timer(self) -> float | None:
        if self.role is Role.DISCOVERING:
            return min(self._next_query, self._election_deadline)
        if self.role is Role.LEADING:
            return min(self._next_announce, self._fanout_at) if self._fanout else self._next_announce
        return None

    def live_peers(self, now: float, within_s: float) -> list[PeerInfo]:
        return [p for p in self.peers.values() if now - p.last_heard <= within_s]

    # ------------------------------------------------------------ transitions

    def _query_while_electing(self, d: Datagram, addr: Dest, now: float) -> None:
        assert isinstance(d.body, Query)  # noqa: S101 - guaranteed by the transition table
        self.max_epoch_seen = max(self.max_epoch_seen, d.body.epoch_seen)
        if self._suspects.get(d.sender, float("-inf")) > now:
            return
        new = d.sender not in self._candidates
        if len(self._candidates) >= MAX_CANDIDATES and new:
            worst = max(self._candidates)
            if d.sender > worst:
                return
            del self._candidates[worst]
        if new and addr is not None and self._should_greet(d.sender, now):
            # The node that will win joined the group after our query, so it never heard us:
            # tell it we are here, so it can count every node of the job and claim at once
            # instead of waiting out its window (the others all heard it, and wait for it).
            self._emit(self._own_query(), addr, now)
        self._candidates[d.sender] = (now, d.body.epoch_seen)
        if (
            self.role is Role.DISCOVERING
            and self.expected_nodes > 1
            and len(self._candidates) + 1 >= self.expected_nodes
            and now < self._election_deadline
            and self._awaiting is None
        ):
            # Every node the job can have has spoken: nobody is left to wait for.
            self._election_deadline = now

    def _should_greet(self, newcomer: int, now: float) -> bool:
        """Answer a newcomer's first query with ours, by unicast: only in a small job (where
        every node speaks, so the election can end once all have), once we have queried, and
        only a newcomer that beats every candidate we know: the one that must hear us all."""
        return (
            self.role is Role.DISCOVERING
            and 0 < self.expected_nodes <= SPEAK_ALL_UP_TO
            and self._queried
            and not self._by_succession
            and newcomer < self._best_candidate(now)
        )

    def _query_while_leading(self, d: Datagram, addr: Dest, now: float) -> None:
        assert isinstance(d.body, Query)  # noqa: S101
        self.max_epoch_seen = max(self.max_epoch_seen, d.body.epoch_seen)
        if addr is not None:
            self._send_announce(addr, now)
        if self._in_our_round(d.sender):
            # The multicast copy is for nodes that stayed silent (a crowd starting at once);
            # the members of our round each ask for themselves, and a thousand of them asking
            # a new leader made it multicast every query_mcast_gap_s, each copy to every node.
            return
        if now - self._last_mcast_announce >= self.timing.query_mcast_gap_s:
            self._send_announce(None, now)

    def _in_our_round(self, node: int) -> bool:
        if self.succession is None:
            return False
        if self._succession_set is None:
            self._succession_set = frozenset(self.succession.members)  # once a round, when asked
        return node in self._succession_set

    def _announce_while_electing(self, d: Datagram, addr: Dest, now: float) -> None:
        claim = self._checked_claim(d, now)
        if claim is None:
            return
        self._follow(d, claim, now, addr)

    def _announce_while_claiming(self, d: Datagram, addr: Dest, now: float) -> None:
        claim = self._checked_claim(d, now)
        own = self._own_claim
        if claim is not None and standing_of_body(claim, self._body_announce(d)) > standing_of(own):
            self._own_claim = None  # the shell's leader_ready() will now be refused
            self._follow(d, claim, now, addr)

    def _announce_while_leading(self, d: Datagram, addr: Dest, now: float) -> None:
        claim = self._checked_claim(d, now)
        own = self._own_claim
        if claim is None or own is None:
            return
        if standing_of_body(claim, self._body_announce(d)) > standing_of_body(own, self._status):
            log.info("[%s %016x] stepping down: %s beats our %s", self.job, self.node_id, claim, own)
            self._events.append(SteppedDown(own=own, winner=claim))
            self._own_claim = None
            self._store = None
            self._follow(d, claim, now, addr)
        elif now - self._last_mcast_announce >= self.timing.announce_min_gap_s:
            self._send_announce(None, now)  # let the weaker claimant hear us and yield

    def _announce_while_following(self, d: Datagram, addr: Dest, now: float) -> None:
        current = self.leader
        body = self._body_announce(d)
        claim = Claim(epoch=body.epoch, leader=d.sender)
        self.max_epoch_seen = max(self.max_epoch_seen, claim.epoch)
        if current is not None and claim == current.claim:
            self.leader = LeaderView.of(claim, body, announced_store_ip(body, addr), is_self=False, now=now)
            return
        checked = self._checked_claim(d, now)
        if checked is not None and (
            current is None or standing_of_body(checked, body) > self._standing_of(current)
        ):
            self._follow(d, checked, now, addr)

    def _standing_of(self, view: LeaderView) -> tuple[int, int, int, int]:
        """The standing of the leader we follow, as this node knows it: a round of its term that
        this node is in proves it established, whatever its last announcement said (they are
        rate-limited: a newcomer's bare claim of the same epoch, heard just after the first
        round formed, must not take the round's members away from its leader)."""
        rank = view.standing()
        if not rank[0] and self.succession is not None and self.succession.claim == view.claim:
            return (1, *rank[1:])
        return rank

    def _resign_from_anyone(self, d: Datagram, addr: Dest, now: float) -> None:
        assert isinstance(d.body, Resign)  # noqa: S101
        claim = Claim(epoch=d.body.epoch, leader=d.sender)
        self.max_epoch_seen = max(self.max_epoch_seen, claim.epoch)
        following = self.leader is not None and self.leader.claim == claim
        if claim not in self._heard_claims and not following:
            return  # never announced: nothing to suspect (and a forgery cannot in advance)
        self._suspect_claim(claim, now)
        if self.role is Role.FOLLOWING and self.leader is not None and self.leader.claim == claim:
            self._lose_leader(now, RESIGNED)

    def _ignore(self, d: Datagram, addr: Dest, now: float) -> None:
        return

    def _answer_probe(self, addr: Dest, now: float) -> None:
        """A leader tells a prober (``ls``) about its job, within a rate limit: no amplifier."""
        self.stats.accepted += 1
        if self.role is not Role.LEADING or addr is None:
            return
        self._probe_tokens = min(
            PROBE_BURST, self._probe_tokens + (now - self._probe_refill) * PROBE_RATE_PER_S
        )
        self._probe_refill = now
        if self._probe_tokens >= 1:
            self._probe_tokens -= 1
            self._send_announce(addr, now)

    # ---------------------------------------------------------------- helpers

    def _enter_discovery(self, now: float) -> None:
        self.role = Role.DISCOVERING
        self.leader = None
        self._own_claim = None
        self._fanout, self._follows = [], None  # a term's unicast announcements end with it
        self._candidates = {}
        self._awaiting = None
        self._queried = False
        self._query_gap = self.timing.query_retry_s
        # The jitter lets most of a crowd hear a better candidate before it speaks (and stay
        # silent); in a small job everyone speaks anyway, and a late joiner would only wait.
        small = 0 < self.expected_nodes <= SPEAK_ALL_UP_TO
        self._next_query = now + (0.0 if small else self._rng.uniform(0.0, self.timing.startup_jitter_s))
        self._election_deadline = now + self.timing.election_window_s

    def _send_query(self, now: float) -> None:
        best = self._best_candidate(now)
        if self._by_succession and best != self.node_id:
            dest = self.succession.dest_of(best) if self.succession is not None else None
            if dest is None:
                self._emit_query(now)
                return
            # Ask the member we wait for, by unicast: it answers once it leads (so does its
            # announcement to every member); the group is not flooded by a whole round asking.
            self._queried = True
            self._emit(self._own_query(), dest, now)
            self._next_query = now + self.timing.query_retry_max_s * (1.0 + 0.1 * self._rng.random())
            return
        small = 0 < self.expected_nodes <= SPEAK_ALL_UP_TO
        if (
            not small
            and not self._queried
            and best != self.node_id
            and self._candidates[best][1] >= self.max_epoch_seen
        ):
            # A better candidate already speaks for us: stay silent, wait for its claim. (In a
            # small job everyone speaks once, so that the election can end once all have.)
            self._next_query = now + self.timing.query_retry_max_s
            return
        self._emit_query(now)

    def _own_query(self) -> Query:
        """Our query: the newest epoch we know, and our addresses."""
        return Query(epoch_seen=self.max_epoch_seen, addrs=self.addrs, round_seen=self.heard.entries())

    def _emit_query(self, now: float) -> None:
        if not self._queried:
            # The window runs from our first query, not from our start: a node whose thread
            # ran late must still give a leader one window to answer before it may claim.
            self._election_deadline = max(self._election_deadline, now + self.timing.election_window_s)
        self._queried = True
        self._emit(self._own_query(), None, now)
        if self._by_succession or self._best_candidate(now) != self.node_id:
            # Someone better is electing, or we take over our round, whose members wait for
            # us (nobody else is electing): retries would only add traffic, a datagram to
            # every node of the group each (five before the window ended, at 10 ms doubling).
            gap = self.timing.query_retry_max_s
        else:
            gap = self._query_gap
            self._query_gap = min(self._query_gap * 2, self.timing.query_retry_max_s)
        # A little jitter keeps many nodes that started together from retrying in lockstep.
        self._next_query = now + gap * (1.0 + 0.1 * self._rng.random())

    def _suspect(self, node: int, now: float) -> None:
        """``node`` did not claim when it should have: passed over until its suspicion ends.
        Ended suspicions are forgotten here, so the table holds only live ones (a job that
        loses nodes for weeks does not keep a row per node it ever suspected)."""
        for old in [n for n, until in self._suspects.items() if until <= now]:
            del self._suspects[old]
        self._suspects[node] = now + self.timing.suspect_ttl_s
        while len(self._suspects) > MAX_SUSPECTS:
            self._suspects.pop(next(iter(self._suspects)))

    def _best_candidate(self, now: float) -> int:
        if self._by_succession and self.succession is not None:
            # The next member of our last round in rank order, whether heard or not: every
            # member computes the same one, so exactly one claims.
            for node in self.succession.members:
                if node not in self._passed and self._suspects.get(node, float("-inf")) <= now:
                    return node
        ttl = self.timing.candidate_ttl_s
        best = self.node_id
        for node, (heard, _) in self._candidates.items():
            if node < best and now - heard <= ttl and self._suspects.get(node, float("-inf")) <= now:
                best = node
        return best

    def _decide(self, now: float) -> None:
        best = self._best_candidate(now)
        if best == self.node_id and now < self._hold_claims_until:
            self._election_deadline = self._hold_claims_until  # we gave up a claim: others first
            return
        if best == self.node_id:
            epoch = self.max_epoch_seen + 1
            self._own_claim = Claim(epoch=epoch, leader=self.node_id)
            self.max_epoch_seen = epoch
            # A new term starts bare: nothing of a term this node led before (its round, its
            # followers, "established") is announced for it until the shell reports the new
            # term's own status. A stale "established" would let this claim depose a running leader.
            self._status = Announce(
                epoch=epoch,
                store_ip=self._status.store_ip,
                store_port=self._status.store_port,
                min_nodes=self._status.min_nodes,
                max_nodes=self._status.max_nodes,
            )
            self.role = Role.CLAIMING
            log.debug("[%s %016x] claiming leadership, epoch %d", self.job, self.node_id, epoch)
            self._events.append(BecomeLeader(epoch=epoch))
            return
        if self._awaiting is None or self._awaiting[0] != best:
            if self._by_succession:
                self._awaiting = (best, now + self.timing.successor_wait_s)
                self._next_query = now  # ask the member we now wait for
            else:
                self._awaiting = (best, now + self.timing.claim_wait_s)
        self._election_deadline = self._awaiting[1]

    def _epoch_ceiling(self) -> int:
        return min(EPOCH_MAX, self.max_epoch_seen + MAX_EPOCH_STEP)

    @staticmethod
    def _epoch_of(d: Datagram) -> int:
        body = d.body
        if isinstance(body, Query):
            return body.epoch_seen
        if isinstance(body, Announce | Resign):
            return body.epoch
        return 0

    def _checked_claim(self, d: Datagram, now: float) -> Claim | None:
        body = self._body_announce(d)
        claim = Claim(epoch=body.epoch, leader=d.sender)
        self.max_epoch_seen = max(self.max_epoch_seen, claim.epoch)
        _remember(self._heard_claims, claim, None)
        if self._suspected_claims.get(claim, float("-inf")) > now:
            self.stats.stale_claims += 1
            return None
        return claim

    @staticmethod
    def _body_announce(d: Datagram) -> Announce:
        if not isinstance(d.body, Announce):
            raise StateError(f"expected an ANNOUNCE body, got {type(d.body).__name__}")
        return d.body

    def _follow(self, d: Datagram, claim: Claim, now: float, addr: Dest) -> None:
        body = self._body_announce(d)
        self.role = Role.FOLLOWING
        self._own_claim = None
        self._by_succession = False
        self.leader = LeaderView.of(claim, body, announced_store_ip(body, addr), is_self=False, now=now)
        self._events.append(LeaderFound(self.leader))

    def _lose_leader(self, now: float, reason: str) -> None:
        lost = self.leader
        if lost is None:
            return
        self.max_epoch_seen = max(self.max_epoch_seen, lost.claim.epoch)
        self._events.append(LeaderLost(claim=lost.claim, reason=reason))
        succession = self.succession
        if (
            succession is not None
            and lost.claim.epoch >= succession.claim.epoch
            and (lost.round <= succession.round or lost.claim != succession.claim)
        ):
            # Our round's leader, or one that took over from it before a new round formed.
            self._passed.add(lost.claim.leader)
            self._by_succession = True
        elif lost.members > 0:
            # A round runs that we are not in (a spare): its members know who takes over, and
            # may pass over a few dead ones first.
            hold = now + SPARE_HOLD_SUCCESSORS * self.timing.successor_wait_s
            self._hold_claims_until = max(self._hold_claims_until, hold)
        self._enter_discovery(now)

    def _suspect_claim(self, claim: Claim, now: float) -> None:
        _remember(self._suspected_claims, claim, now + self.timing.suspect_ttl_s)
        self.max_epoch_seen = max(self.max_epoch_seen, claim.epoch)

    def _own_view(self, now: float) -> LeaderView:
        if self._own_claim is None or self._store is None:
            raise StateError("own leader view requested while not leading")
        # leader_ready() put our store's port in the status we announce.
        return LeaderView.of(self._own_claim, self._status, self._store[0], is_self=True, now=now)

    def _send_announce(self, dest: Dest, now: float) -> None:
        if self._own_claim is None or self._store is None:
            return
        self._emit(self._status, dest, now)
        if dest is None:
            self._last_mcast_announce = now

    def _schedule_announce(self, now: float) -> None:
        if self._burst_left:
            self._next_announce = now + self._burst_left.pop(0)
        else:
            self._next_announce = now + self.timing.beacon_interval_s

    def _emit(self, body: Query | Announce | Resign, dest: Dest | list[Dest], now: float) -> None:
        """Send ``body`` to ``dest``, or to each of a list of destinations (the same datagram:
        each receiver sees its nonce once)."""
        dgram = Datagram(
            job=self.job,
            sender=self.node_id,
            body=body,
            sent_ms=self._wall_ms(now),
            nonce=self._rng.getrandbits(64),
        )
        data = self.codec.encode(dgram)
        dests = dest if isinstance(dest, list) else [dest]
        self._outbox.extend((data, d) for d in dests)
        self.stats.sent += len(dests)

    def _wall_ms(self, now: float) -> int:
        return max(0, int((now + self.wall_offset_s) * 1000))

    def _note_peer(self, d: Datagram, addr: Dest, now: float) -> None:
        addrs = tuple(with_scope_of(a, addr) for a in d.body.addrs) if isinstance(d.body, Query) else ()
        old = self.peers.pop(d.sender, None)
        if old is not None and not addrs:
            addrs = old.addrs
        self.peers[d.sender] = PeerInfo(node=d.sender, addr=addr, last_heard=now, addrs=addrs)
        if len(self.peers) > MAX_PEERS:
            self.peers.popitem(last=False)

    def _count_other_job(self, job: str) -> None:
        jobs = self.stats.other_jobs
        if job in jobs:
            jobs[job] += 1
        elif len(jobs) < MAX_OTHER_JOBS:
            jobs[job] = 1
        else:
            self.stats.other_jobs_overflow += 1


def _count_invalid(core: Discovery, reason: str, addr: Dest, now: float) -> None:
    """A datagram dropped: counted, and logged at most once a minute per reason (but for the
    reasons normal on a healthy network, ``QUIET_REASONS``)."""
    core.stats.invalid[reason] += 1
    if reason in QUIET_REASONS:
        return
    last = core._invalid_logged_at.get(reason)
    if last is None or now - last >= INVALID_LOG_INTERVAL_S:
        core._invalid_logged_at[reason] = now
        log.warning(
            "[%s %016x] dropped an invalid datagram from %s (%s%s); %d dropped so far, "
            "logged at most once a minute per reason",
            core.job,
            core.node_id,
            addr,
            reason,
            f": {DROP_MEANINGS[reason]}" if reason in DROP_MEANINGS else "",
            core.stats.dropped_total(),
        )


_V = TypeVar("_V")


def _remember(table: OrderedDict[Claim, _V], claim: Claim, value: _V) -> None:
    """Put ``claim`` last in a table of recent claims capped at MAX_SUSPECTS (oldest dropped)."""
    table[claim] = value
    table.move_to_end(claim)
    while len(table) > MAX_SUSPECTS:
        table.popitem(last=False)


_TRANSITIONS: dict[tuple[Role, MsgType], _Handler] = {
    (Role.IDLE, MsgType.QUERY): Discovery._ignore,
    (Role.IDLE, MsgType.ANNOUNCE): Discovery._ignore,
    (Role.IDLE, MsgType.RESIGN): Discovery._ignore,
    (Role.DISCOVERING, MsgType.QUERY): Discovery._query_while_electing,
    (Role.DISCOVERING, MsgType.ANNOUNCE): Discovery._announce_while_electing,
    (Role.DISCOVERING, MsgType.RESIGN): Discovery._resign_from_anyone,
    (Role.CLAIMING, MsgType.QUERY): Discovery._query_while_electing,
    (Role.CLAIMING, MsgType.ANNOUNCE): Discovery._announce_while_claiming,
    (Role.CLAIMING, MsgType.RESIGN): Discovery._resign_from_anyone,
    (Role.LEADING, MsgType.QUERY): Discovery._query_while_leading,
    (Role.LEADING, MsgType.ANNOUNCE): Discovery._announce_while_leading,
    (Role.LEADING, MsgType.RESIGN): Discovery._resign_from_anyone,
    (Role.FOLLOWING, MsgType.QUERY): Discovery._ignore,
    (Role.FOLLOWING, MsgType.ANNOUNCE): Discovery._announce_while_following,
    (Role.FOLLOWING, MsgType.RESIGN): Discovery._resign_from_anyone,
    (Role.STOPPED, MsgType.QUERY): Discovery._ignore,
    (Role.STOPPED, MsgType.ANNOUNCE): Discovery._ignore,
    (Role.STOPPED, MsgType.RESIGN): Discovery._ignore,
    # PROBE never reaches the table: receive_datagram answers it for any job, in any role.
    **{(role, MsgType.PROBE): Discovery._ignore for role in Role},
}
