"""Rendezvous rounds, decided without I/O: who is admitted, in which rank order, and when.

How it works
------------
The leader owns a ``RoundBook`` for its term. Nodes ask to join (``join``), leave, close the
job, die (``died``: their connection to the leader broke or went silent) or arrive at torch's
exit barrier (``arrive``). ``decide(now)`` answers ``Form`` (publish a round with these
members now) or ``Wait`` (until a deadline, or until something happens):

* A round needs the leader (it is rank 0, its node hosts the store) and ``min_nodes``.
* It forms at once with ``max_nodes``; beyond that, joiners wait as spares.
* It forms at once when every node expected back has re-joined: on a re-rendezvous
  (worker failure, node loss, new leader) we know who was in the last round, so there is
  nobody to wait for. A new leader learns the last round from the joiners' history.
* Otherwise it forms when ``last_call_timeout`` has passed since ``min_nodes`` was
  reached, exactly as torch's c10d backend does for the first round of a job.

**Quorum and the two phases of a round.** A round after the first is formed from a *base*:
the newest round the leader knows to have formed (its own, or the newest history a joiner
reports). It is first *proposed*: the members of the new round and the voters of the base
(its members, but those that left: ``_evidence``) each record it (``accepted``, written to
their state file before they answer) and answer ``accept``; it is *formed* (committed: the
members' agents get it) once a majority of the base's voters accepted it. A node accepts
only from the leader it follows, and only a proposal that accounts for what it accepted
before. A proposal that some joiner accepted from another term, newer than the base, may
have formed without our knowing: a majority of its voters must accept ours too
(``constraints``). So any two rounds that form from one base share a node that accepted
both, and the second one's leader knew of the first (``may_accept``, ``quorum_met``). A
job's *first* round is proposed to its members and forms once every one of them accepted it
(``Form.unanimous``): each then knows of it, and none founds another job beside it if the
leader is lost before they hear that it formed. A member that never answers is dropped as
any lost node is; one that refuses without a reason (it cannot record a vote) is left out
of it (``abstain``) and taken into the next round.

A node *returning* to a job that runs without it (it was dropped: frozen, cut off, or it led
an older term) does not restart a healthy round at once: it is counted in
``num_nodes_waiting`` only once that round has run for ``rejoin_delay_s``, doubled for each
time the node was dropped in this term. A node that flaps therefore never keeps a fresh
round from training. A genuine newcomer is counted at once, as with c10d, and so is a
*restarted* node: a new process that took over its dead predecessor's node id (``_identity``)
and has not been in a round yet (its join says ``restarted``). Its predecessor is gone, not
flapping; what it costs is the restart that takes it in, as a newcomer's. Only a node that
restarts again within ``rejoin_delay_s`` of its last restart keeps dying: it is held back as
a returning node (``_returns_held``, the one place for this rule).

Ranks (``rank_order``): the leader is 0, as its node hosts the store. Each joiner may carry a
*place* (its host name, a number from its environment, a topology label: ``_order``). With
places, every member is sorted by place and the sorted list is read as a ring starting at the
leader: the ring that NCCL builds is the place order, whoever leads. Without places (or
between equal ones) members of the previous round keep their relative order and newcomers
follow in arrival order. Every node reads the same published order, so ranks agree. Round
numbers only grow, across terms too: a new round is numbered after every round the leader
heard of, and a term that learns of a round formed or proposed by a term at least as new as
itself gives way (``outdated_by``): the fencing token (epoch, round) never goes back.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Collection

from torch_mingle._frames import Join
from torch_mingle._jobview import Chronicle
from torch_mingle._keys import RoundKey, newest_key
from torch_mingle._ledger import Ledger
from torch_mingle._others import OtherTerms, join_lines
from torch_mingle._places import natural_key
from torch_mingle._record import field, record
from torch_mingle._records import (
    MAX_MEMBERS,
    Heard,
    History,
    JobEnd,
    Lines,
    Round,
    Status,
    WaitKind,
    heard_entry,
    node_hex,
)
from torch_mingle._settings import RoundRules

MAX_HOLD_DOUBLINGS = 5


@record
class JoinRequest:
    """A join as the leader's book keeps it: the node's ``Join`` as it sent it, and what only the
    leader's side knows (who sent it, which process, its last round whole where the join named
    it by number)."""

    node: int
    join: Join
    #: The node's last round (``Join.history``, or the round ``Join.ref`` names).
    history: History | None = None
    #: Which process of its node id sent it (``_identity``).
    incarnation: int = 1


def rank_order(
    leader: int,
    pending: dict[int, JoinRequest],
    previous: tuple[int, ...] = (),
    limit: int | None = None,
) -> tuple[int, ...]:
    """The members of the next round in rank order: the leader first (it hosts the store).

    Who is admitted (at most ``limit``) does not depend on places: the leader, then the previous
    round's members, then arrival order, so a spare never takes a running member's place.

    A job's first round (no ``previous``) is ordered by the policy: with places, the ascending
    order of ``(place, arrival)`` read as a ring from the leader (members adjacent in place
    order stay adjacent, rank n-1 and rank 0 too); without, the admission order. A round that
    follows another keeps ranks (``keep_ranks``): the policy only places the newcomers.
    """
    prev_rank = {node: i for i, node in enumerate(previous)}
    arrival = {node: i for i, node in enumerate(pending)}
    late = len(previous)

    def admission(n: int) -> tuple[bool, int, int]:
        return (n != leader, prev_rank.get(n, late), arrival.get(n, -1))

    admitted = sorted({leader, *pending}, key=admission)[:limit]
    placed = any(req.join.place for req in pending.values())

    def by_policy(nodes: list[int]) -> list[int]:
        if not placed:
            return nodes
        return sorted(
            nodes, key=lambda n: (natural_key(pending[n].join.place) if n in pending else (), admission(n))
        )

    if previous:
        return keep_ranks(
            leader, admitted, prev_rank, by_policy([n for n in admitted[1:] if n not in prev_rank])
        )
    ring = by_policy(admitted)
    at = ring.index(leader)
    return tuple(ring[at:] + ring[:at])


def keep_ranks(
    leader: int, admitted: list[int], prev_rank: dict[int, int], newcomers: list[int]
) -> tuple[int, ...]:
    """A round that follows another: every member of the previous round keeps its rank; the
    leader is rank 0 (it hosts the store); the ranks left free (by the nodes lost, by a new
    leader that held another rank, beyond the previous world size) go, lowest first, to the
    members whose rank is no longer theirs to keep (the previous rank 0, and, when the job
    shrank, those whose rank is now past the end, in their previous order), then to the
    newcomers in the policy's order. So a spare takes the rank of the node it replaces, and a
    shrinking job moves only the members whose ranks no longer exist."""
    slots: list[int | None] = [None] * len(admitted)
    slots[0] = leader
    displaced = []
    for node in sorted((n for n in admitted[1:] if n in prev_rank), key=prev_rank.__getitem__):
        rank = prev_rank[node]
        if 0 < rank < len(slots):
            slots[rank] = node
        else:
            displaced.append(node)
    fill = iter(displaced + newcomers)
    return tuple(slot if slot is not None else next(fill) for slot in slots)


@record
class Form:
    members: tuple[int, ...]
    reason: str
    ips: tuple[str, ...] = ()
    dports: tuple[int, ...] = ()
    pports: tuple[int, ...] = ()
    #: The round's number: after every round the leader knows of.
    number: int = 0
    #: Whose acceptance forms it: a majority of each of these voter sets (the base's, and each
    #: proposal of another term it must account for); ``unanimous``: the first set is the round's
    #: own members, and all of them.
    constraints: tuple[frozenset[int], ...] = ()
    #: A round of no base (the first of its line): every member accepts it before it forms (``_form``).
    unanimous: bool = False
    #: The proposals and rounds of other terms it accounts for (a majority of each one's voters,
    #: and its lines): (epoch, leader, round). A rival round is named too (seed 64005782).
    covers: tuple[tuple[int, int, int], ...] = ()
    #: The round it is formed from: its number (0: none) and which it is (epoch, leader, round).
    base: int = 0
    base_key: tuple[int, int, int] | None = None
    #: The lines it continues (``Round.lines``): the base's, then those of the rivals it takes
    #: in; for a round of no base, only those (its own line, which it founds, goes first).
    lines: Lines = ()


@record
class Wait:
    until: float | None
    kind: WaitKind
    reason: str


@record(frozen=False)
class RoundBook:
    """The leader's state of the job during its term."""

    leader: int
    epoch: int
    #: The job's size, its waits and its quorum, as the node was told them (``_settings``).
    rules: RoundRules
    #: What the term knows of the job's other terms: the rounds its nodes heard of, the
    #: proposals and rounds of other terms its joiners accepted or were in (``_others``).
    others: OtherTerms = field(default_factory=OtherTerms)
    pending: dict[int, JoinRequest] = field(default_factory=dict)
    #: Joiners that refused a first round without a reason (a node that cannot record its vote
    #: refuses every proposal): left out of first rounds, which every member must accept; a
    #: later round, which a majority of its base's voters forms, takes them in (``abstain``).
    abstained: set[int] = field(default_factory=set)
    current: Round | None = None
    formed_at: float = 0.0
    #: How the job ended (``close``); None: it goes on.
    end: JobEnd | None = None
    #: Who is lost, left or gone, and the rules that read it (``_ledger``).
    ledger: Ledger = field(default_factory=Ledger)
    #: What ended and began its last rounds, for ``torch-mingle status`` (``_jobview``).
    chronicle: Chronicle = field(default_factory=Chronicle)
    #: Members of the current round known to be in torch's exit barrier.
    arrived: set[int] = field(default_factory=set)
    last_round_number: int = 0
    ips: dict[int, str] = field(default_factory=dict)
    #: Each node's last restart in this term (``_returns_held``): its incarnation, when that
    #: process first joined, and when the one before it did (None: no restart before).
    restarted_at: dict[int, tuple[int, float, float | None]] = field(default_factory=dict)
    _returning: set[int] = field(default_factory=set)
    #: The members whose death or departure broke the current round (``stale``).
    _broken_by: set[int] = field(default_factory=set)
    _min_reached_at: float | None = None
    _reason: str = "waiting for the first join"
    _kind: WaitKind = WaitKind.FIRST_JOIN
    # Kept as ``pending`` changes, so that a join costs O(1) and not O(N) (N joins a round):
    #: the newest round a joiner reported (``_latest_known`` False: to be found again) ...
    _latest: History | None = None
    _latest_known: bool = True
    #: ... how many joiners run in the current round ...
    _rejoined: int = 0
    #: Whether a member of the current round joined again since it formed (even if that join
    #: is gone since: a join that timed out or left ended its workers all the same): ``runs``.
    _member_joined: bool = False
    #: ... and the nodes the next round waits for, with the round or history they come from.
    _base: tuple[object, frozenset[int]] | None = None
    #: The current round as a history (the base, while no joiner reports a newer one).
    _current_history: History | None = None
    #: ``all_gone``'s list of nodes, and where in it the live node it found last time is.
    _gone_cursor: tuple[list[int], int] = field(default_factory=lambda: ([], 0))
    #: The highest round number this term proposed.
    _proposed: int = 0
    #: The newest formed round a node reported when it refused a proposal.
    _learned: History | None = None

    # ----------------------------------------------------------------- inputs

    def join(self, req: JoinRequest, now: float) -> None:
        self._pend(req)
        self.ips[req.node] = req.join.ip
        if len(self.ips) > 2 * MAX_MEMBERS:
            self._forget_strangers()
        self.ledger.joined(req.node)
        for node, key in req.join.gone:
            if node not in self.pending:
                self.ledger.reported_gone(node, key)
        if req.history is not None:
            self.last_round_number = max(self.last_round_number, req.history.round)
            if req.history.term != (self.epoch, self.leader):
                self.others.ran(req.history, self.base)
        self.votes_told(req.join.accepted, req.join.earlier)
        self.others.hear(req.join.seen)
        was_member = req.history is not None and req.history.has(req.node)
        returning = (
            self.current is not None
            and req.node not in self.current.member_set
            and (was_member or req.node in self.ledger.drops)
        )
        if self._returns_held(req, returning, now):
            self._returning.add(req.node)
        else:
            self._returning.discard(req.node)

    def _returns_held(self, req: JoinRequest, returning: bool, now: float) -> bool:
        """Whether a joiner is held back by ``rejoin_delay_s`` (see the module doc): it returns to
        a round that runs without it, and it is not a restarted process whose last restart in
        this term was at least ``rejoin_delay_s`` ago. Every restart is recorded."""
        if not req.join.restarted:
            return returning
        known = self.restarted_at.get(req.node)
        if known is None or known[0] != req.incarnation:  # a new process (not its join again)
            known = (req.incarnation, now, known[1] if known is not None else None)
            self.restarted_at[req.node] = known
        _, at, before = known
        return returning and before is not None and at - before < self.rules.rejoin_delay_s

    def votes_told(self, accepted: History | None, earlier: tuple[History, ...]) -> None:
        """A node's vote and the earlier ones it replaced (``Ballot.told``), by its join or its
        refusal: each of another term may have formed, and the next round must account for it."""
        for vote in (accepted, *earlier):
            if vote is not None and vote.members and vote.term != (self.epoch, self.leader):
                self.last_round_number = max(self.last_round_number, vote.round)
                self.others.accepted(vote, self.base)

    def said_it_left(self, node: int, said: RoundKey | None = None) -> None:
        """``node`` left the job by its own word, seen on its connection (``_evidence``): it no
        longer votes on the successor of the newest round it was in or voted for."""
        self.ledger.said_it_left(node, newest_key(said, self.known_key(node)))

    def leave(self, node: int, said: RoundKey | None = None) -> None:
        """``node`` leaves the job; ``said``: the newest round it was in or voted for, by its own
        word (its ``leave`` frame)."""
        self.ledger.leave(node, newest_key(said, self.known_key(node)))
        self._unpend(node)
        if self.current is not None and node in self.current.member_set and node not in self.arrived:
            self._broken_by.add(node)  # it left a running round (preempted): the others go on without it

    @property
    def closed(self) -> bool:
        return self.end is not None

    def close(self, end: JobEnd | None = None) -> list[int]:
        """Close the job as ``end`` says (None: closed, nothing failed); returns the nodes whose
        pending joins must be answered "closed"."""
        self.end = end if end is not None else JobEnd()
        nodes = list(self.pending)
        for node in nodes:
            self._unpend(node)
        self._kind, self._reason = WaitKind.CLOSED, "closed"
        return nodes

    def died(self, node: int, why: str) -> bool:
        """Mark ``node`` lost (its connection ended or went silent: it keeps its vote, see
        ``_evidence``); True if it had a pending join (to be answered "retry")."""
        if not self.ledger.died(node, why):
            return False
        dropped = self._unpend(node)
        if self.current is not None and node in self.current.member_set and node not in self.arrived:
            self._broken_by.add(node)  # (a member that finished and is in the exit barrier stalls no one)
        return dropped is not None

    @property
    def stale(self) -> bool:
        """A member of the current round died or left before the exit barrier: the round must
        be restarted without it."""
        return bool(self._broken_by)

    def may_resend(self, node: int) -> bool:
        """Whether ``node``, a member of the current round that asks for it again (its answer
        was lost with its connection), may still run it: nobody else broke the round, and no
        member has joined again (then the next round is under way and it joins that)."""
        rnd = self.current
        return (
            rnd is not None
            and node in rnd.member_set
            and not self.closed
            and not self.ledger.has_left(node)
            and self._rejoined == 0
            and self._broken_by <= {node}
        )

    def revive(self, node: int) -> None:
        """A member of the current round counted lost is in it after all (the leader sent it the
        round again): its loss is forgotten, and the round is healthy again (``may_resend``)."""
        self.ledger.revive(node)  # (if counted lost: not when its new connection superseded the old one)
        self._broken_by.discard(node)

    def withdraw(self, node: int) -> None:
        """The node's join ended without a round (it timed out, or the connection it came on
        was superseded or said bye): it is no longer counted."""
        self._unpend(node)

    def arrive(self, node: int, round_number: int) -> None:
        if self.current is not None and round_number == self.current.number:
            self.arrived.add(node)

    def formed(self, rnd: Round, now: float) -> None:
        """``rnd`` formed (a majority of its base's voters accepted it): it is the current round."""
        base = self.base()
        self.chronicle.formed(rnd, self.current, now)
        self.current = rnd
        self.abstained.clear()
        self._forget_strangers(base.members if base is not None else ())
        self._current_history = History.of(rnd)
        self.formed_at = now
        self.last_round_number = max(self.last_round_number, rnd.number)
        for node in rnd.members:
            self._unpend(node)
            self._returning.discard(node)
        self._rejoined = sum(1 for node in self.pending if node in rnd.member_set)
        self._member_joined = self._rejoined > 0
        self._broken_by = set()
        self.arrived = set()
        self._min_reached_at = None

    # --------------------------------------------------------------- decision

    def decide(self, now: float) -> Form | Wait:
        if self.closed:
            return self._wait(None, WaitKind.CLOSED, "closed")
        newer = self.outdated_by()
        if newer is not None:
            return self._wait(
                None,
                WaitKind.GIVES_WAY,
                f"a term of epoch {newer} formed or proposed a round: this one gives way",
            )
        hold = self._next_hold_end(now)  # when a held-back node may restart the round: decide again
        if self.leader not in self.pending:
            return self._wait(hold, WaitKind.LEADERS_JOIN, "waiting for the leader's own join")
        n = min(len(self.pending), self.rules.max_nodes)  # the leader's own join is among them
        if n < self.rules.min_nodes:
            self._min_reached_at = None
            return self._wait(hold, WaitKind.TOO_FEW, f"{n} of min_nodes={self.rules.min_nodes} nodes joined")
        first = self.rules.first_round_majority and self.base() is None and not self.others.heard
        if first and 2 * n <= self.rules.max_nodes:
            self._min_reached_at = None
            return self._wait(
                hold,
                WaitKind.FIRST_MAJORITY,
                f"{n} nodes joined; the first round needs more than half of max_nodes={self.rules.max_nodes}",
            )
        if self._min_reached_at is None:
            self._min_reached_at = now
        if n == self.rules.max_nodes:
            return self._form(f"max_nodes={self.rules.max_nodes} joined", hold)
        if self._expected_joined():
            return self._form("every live node of the last round re-joined", hold)
        deadline = self._min_reached_at + self.rules.last_call_timeout_s
        if now >= deadline:
            return self._form(f"last call ({self.rules.last_call_timeout_s:g}s) ended", hold)
        until = deadline if hold is None else min(deadline, hold)
        return self._wait(
            until,
            WaitKind.LAST_CALL,
            f"last call: {n} joined, up to max_nodes={self.rules.max_nodes} may still come",
        )

    def _form(self, reason: str, hold: float | None = None) -> Form | Wait:
        """The round of the first ``max_nodes`` in rank order (sorted only now: a decision to
        wait, made once per batch of joins, sorts nothing), if it has a quorum."""
        admit = self._rank_order()
        base, uncertain, rivals = self.base(), self.uncertain(), self.rivals()
        first = self.rules.quorum and base is None
        if first and self.abstained:
            admit = tuple(m for m in admit if m not in self.abstained)
        # Every joiner votes, a member of the new round or not (a spare that leads takes a place
        # at rank 0; the voters it leaves out accept the round all the same: ``quorum_met``).
        short = self._no_quorum(self.pending.keys(), base, uncertain, rivals)
        if short is not None:
            return self._wait(hold, WaitKind.NO_QUORUM, short)
        joins = [self.pending[m] for m in admit]
        number = self.next_number()
        bases = [h for _, h in self._voting(base, uncertain, rivals)] if self.rules.quorum else []
        constraints = tuple(v for v in (self.ledger.voters_of(h.members, h.key) for h in bases) if v)
        if first:
            # A first round is accepted by every one of its members before it forms: if its
            # leader is lost before they heard that it formed, each still knows of it, so none
            # founds another job beside it (a member that never heard of the round it was
            # counted in, cut off one way, founded one with nodes that had heard of nothing:
            # seed 3037179). A member that never answers is dropped as any lost node is, and
            # the round is proposed again without it. So too with proposals of other terms to
            # account for (a majority of each, after all of its own members): it is still the
            # first round of its line (seed 19061: round 2 of no base formed with four of its
            # six members, and the two left out founded a job of their own beside it).
            constraints = (frozenset(admit), *constraints)
        return Form(
            members=admit,
            reason=reason,
            ips=tuple(j.join.ip for j in joins),
            dports=tuple(j.join.dport for j in joins),
            pports=tuple(j.join.pport for j in joins),
            number=number,
            constraints=constraints,
            unanimous=first,
            covers=tuple(p.key for p in (*uncertain, *rivals)),
            base=base.round if base is not None else 0,
            base_key=base.key if base is not None else None,
            lines=join_lines(
                (base.lines or (base.key,)) if base is not None else ((self.epoch, self.leader, number),),
                *(r.lines or (r.key,) for r in rivals),
                # A proposal it accounts for may have formed: if it did, this round is its
                # successor and continues its line (seed 5000210: a round heard of that a later
                # proposal accounted for is accounted for).
                *((p.key, *p.lines) for p in uncertain),
            ),
        )

    def abstain(self, node: int) -> None:
        """``node`` refused a first round and said nothing it knows: it cannot record a vote
        (``Identity.save``), so a first round that waits for its vote never forms."""
        if node in self.pending:
            self.abstained.add(node)

    def learn(
        self, history: History | None, accepted: History | None, earlier: tuple[History, ...] = ()
    ) -> None:
        """What a node told when it refused a proposal: a round it knows formed (the base may be
        newer than the joiners said), or proposals of other terms it accepted (its vote, and the
        ``earlier`` ones it replaced)."""
        if history is not None and history.newer_than(self._learned):
            self._learned = history
            self.last_round_number = max(self.last_round_number, history.round)
        self.votes_told(accepted, earlier)

    def next_number(self) -> int:
        """The next round's number: after every round this term knows of, formed or proposed."""
        return max(self.last_round_number, self.others.heard.round, self._proposed) + 1

    def proposed(self, number: int) -> None:
        """The term proposed round ``number`` (formed or not, no later round reuses it)."""
        self._proposed = max(self._proposed, number)

    def hear(self, heard: Heard) -> bool:
        """Rounds of the job formed: a node of this term heard of them (``OtherTerms.hear``);
        True if that is news."""
        return self.others.hear(heard)

    def highest_heard(self) -> Heard:
        """The rounds of the job this leader knows formed: its base (its own round, the newest
        its joiners were in) and those its nodes heard of (a proposal that may never have formed
        does not count). Told to every node it welcomes, answers or announces to, so a node that
        met this term knows the job ran, and which round, even before the term forms one."""
        base = self.base()
        return self.others.heard.with_keys(heard_entry(base.key, base.line) if base is not None else None)

    def highest_round(self) -> int:
        """The highest round number of ``highest_heard``."""
        return self.highest_heard().round

    def base(self) -> History | None:
        """The newest round the leader knows formed: its current one, or the newest history a
        joiner reports (a term that took over learns the last round from its joiners), or one
        a node reported when it refused a proposal."""
        best: History | None = None
        for h in (self._current_history, self._latest_history(), self._learned):
            if h is not None and h.newer_than(best):
                best = h
        return best

    def uncertain(self) -> list[History]:
        """Proposals of other terms, newer than the base, that joiners accepted (``OtherTerms.uncertain``)."""
        return self.others.uncertain(self.base())

    def rivals(self) -> list[History]:
        """Rounds of another line of the job that joiners were in or accepted (``OtherTerms.rivals``)."""
        return self.others.rivals(self.base(), self._current_history)

    def outdated_by(self) -> int | None:
        """The epoch of a newer term that formed or proposed a round this leader knows of
        (``OtherTerms.outdated_by``): this term must give way."""
        return self.others.outdated_by(self.base(), (self.epoch, self.leader))

    def known_key(self, node: int) -> RoundKey | None:
        """The newest round ``node`` is known here to have been in or voted for: its join's
        report (its last round, the proposal it accepted) and the current round if it is a
        member. Erring newer is safe (it keeps its vote on the older rounds), older is not."""
        keys: list[RoundKey | None] = []
        pending = self.pending.get(node)
        if pending is not None:
            keys += [h.key for h in (pending.history, pending.join.accepted) if h is not None]
        if self.current is not None and node in self.current.member_set:
            keys.append(self.current_key())
        return newest_key(*keys)

    def current_key(self) -> RoundKey | None:
        rnd = self.current
        return rnd.key if rnd is not None else None

    def status(self, now: float) -> Status:
        size, end = self.current.world_size if self.current else 0, self.end
        return Status(
            epoch=self.epoch,
            round=self.current.number if self.current else 0,
            size=size,
            joined=len(self.pending),
            waiting=self._waiting(now),
            stale=self.stale,
            closed=end is not None,
            reason=self._reason,
            failed=end.why if end is not None and end.stops_round else "",
            broken=self._why_broken() if self._broken_by else "",
            job_failed=end is not None and end.failed,
        )

    def _why_broken(self) -> str:
        """Who broke the current round, and how (the first few, by node id)."""
        why = self.ledger.lost_why
        said = [
            f"node {node_hex(n)} " + (f"lost ({why[n]})" if n in why else "left")
            for n in heapq.nsmallest(4, self._broken_by)
        ]
        more = len(self._broken_by) - 4
        return "; ".join(said) + (f"; {more} more" if more > 0 else "")

    def runs(self) -> bool:
        """Whether a healthy round runs: the current one, not broken, not closed, and none of its
        members joined again since it formed (that join stopped its workers, whether it is still
        there or timed out since). Once one did, the next round is under way, and a node that
        waits beside it waits for a round, with a deadline (seed 898: the leader, its round's
        only member, joined again and found no quorum, and a spare parked beside that round
        waited with no deadline long after the leader's own join timed out)."""
        return self.current is not None and not self.stale and not self.closed and not self._member_joined

    def parked(self, node: int) -> bool:
        """True while a healthy round runs without ``node``: it waits for the job, not for a timeout."""
        rnd = self.current
        return rnd is not None and self.runs() and node not in rnd.member_set

    def explain(self) -> str:
        """Why no round forms now, naming the nodes the book waits for."""
        missing = self.missing()
        if not missing:
            return self._reason
        why = self.ledger.lost_why
        named = "; ".join(
            f"{node_hex(n)} ({self.ips.get(n, 'address unknown')}: {why.get(n, 'not re-joined')})"
            for n in missing
        )
        return f"{self._reason}; waiting for {named}"

    def missing(self) -> list[int]:
        """Members of the last round that have not (re-)joined, the dead ones included."""
        previous = self._previous_members()
        if previous is None:
            return []
        return sorted(
            n for n in previous if n not in self.pending and not self.ledger.has_left(n) and n != self.leader
        )

    def tracked(self) -> set[int]:
        """Nodes whose liveness matters: members of the current round and joiners."""
        members = set(self.current.members) if self.current else set()
        return {n for n in members | self.pending.keys() if self.ledger.live(n)}

    def departed(self) -> set[int]:
        """Members of the current round that left or died."""
        return self.ledger.out_of(self.current.member_set) if self.current else set()

    def barrier_to_open(self) -> bool:
        """True when torch's exit barrier of the current round must be opened by the leader.

        That is when every member is either known to be in the barrier or gone, and some are
        gone without having arrived (they never will). A member that arrived and then died is
        counted once: the barrier never opens while a live member's workers still run.
        """
        if self.current is None or not self.arrived:
            return False
        gone = self.gone_from_barrier()
        return bool(gone) and self.current.member_set <= (self.arrived | gone)

    def gone_from_barrier(self) -> set[int]:
        """Members of the current round that left or died without arriving in its barrier."""
        return self.departed() - self.arrived

    def all_gone(self) -> bool:
        """True once every node except the leader has left or died (the leader may then stop).

        Asked at every departure while a leader shuts down. A cursor walks a list of the nodes
        and stops at the first live one, which it looks at first next time: it passes each gone
        node once, where building ``tracked()`` per departure made a shutdown of N nodes
        O(N**2). "All gone" is confirmed by a fresh pass (the list may miss later joiners).
        """
        nodes, at = self._gone_cursor
        while at < len(nodes) and not self._live(nodes[at]):
            at += 1
        if at < len(nodes):
            self._gone_cursor = (nodes, at)
            return False
        members = self.current.members if self.current else ()
        nodes = [n for n in itertools.chain(members, self.pending) if n != self.leader]
        at = next((i for i, node in enumerate(nodes) if self._live(node)), len(nodes))
        self._gone_cursor = (nodes, at)
        return at == len(nodes)

    def _live(self, node: int) -> bool:
        """Tracked (a member of the current round or a joiner) and neither dead nor left."""
        tracked = node in self.pending or (self.current is not None and node in self.current.member_set)
        return tracked and self.ledger.live(node)

    # ---------------------------------------------------------------- helpers

    def _forget_strangers(self, also: Collection[int] = ()) -> None:
        """Bound what the book remembers per node id: keep the round's members, the joiners and
        ``also`` (when a round forms: the members of the round it was formed from, whose drops
        and departures still count for a while). Every other id goes: a job that runs for months,
        its hosts replaced now and then under new node ids, keeps only what its rounds need."""
        keep = (
            set(self.pending) | set(self.current.members if self.current else ()) | set(also) | {self.leader}
        )
        for table in (self.ips, self.restarted_at):
            for node in [n for n in table if n not in keep]:
                del table[node]
        self.ledger.forget(keep)
        self._returning &= keep

    def voters(self) -> set[int]:
        """The base's members that vote on the next round: all but those that left."""
        base = self.base()
        return set(self.ledger.voters_of(base.members, base.key)) if base is not None else set()

    def _no_quorum(
        self,
        joined: Collection[int],
        base: History | None,
        uncertain: list[History],
        rivals: list[History],
    ) -> str | None:
        """Why the nodes that ``joined`` may not form a round (None: they may): they must hold a
        majority of the voters of the base, of every proposal it must account for
        (``uncertain``) and of every round of another line it knows of (``rivals``); no round
        it heard of may be one whose members it does not know (``OtherTerms.unaccounted``); the round
        forms once those voters accepted it (``quorum_met``).

        Invariant: two rounds formed from one base share a voter. A member that was lost keeps
        its vote (it may be alive on the other side of a partition, with a leader of its own);
        only one that left gives it up.
        """
        if not self.rules.quorum:
            return None
        stranger = self.others.unaccounted(base, [*uncertain, *rivals], (self.epoch, self.leader))
        if stranger is not None:
            epoch, leader, number = stranger
            return (
                f"no quorum: round {number} of this job (epoch {epoch}, leader {leader:016x}) ran, "
                "and none of its members joined yet (this side of a partition may hold only spares, "
                "or another side of a split at the job's start)"
            )
        for what, h in self._voting(base, uncertain, rivals):
            voters = self.ledger.voters_of(h.members, h.key)
            have = len(voters.intersection(joined))
            if voters and 2 * have <= len(voters):  # none: every voter left
                return (
                    f"no quorum: {have} of the {len(voters)} voting members of {what} joined, "
                    f"{len(voters) // 2 + 1} needed; the lost ones may be alive across a partition "
                    "(they vote until they leave; quorum=none goes on without them)"
                )
        return None

    @staticmethod
    def _voting(
        base: History | None, uncertain: list[History], rivals: list[History]
    ) -> list[tuple[str, History]]:
        """The rounds whose voters the next round needs a majority of (each named for a reason
        to wait): the base, every proposal it accounts for, every round of another line."""
        return (
            ([(f"round {base.round}", base)] if base is not None else [])
            + [(f"round {p.round} that epoch {p.epoch} proposed", p) for p in uncertain]
            + [(f"round {r.round} of epoch {r.epoch} (another line of this job)", r) for r in rivals]
        )

    def _wait(self, until: float | None, kind: WaitKind, reason: str) -> Wait:
        self._kind, self._reason = kind, reason
        return Wait(until=until, kind=kind, reason=reason)

    @property
    def wait_kind(self) -> WaitKind:
        """Why the last decision waited (``explain`` says it in words)."""
        return self._kind

    def _hold_end(self, node: int) -> float:
        doublings = min(MAX_HOLD_DOUBLINGS, max(0, self.ledger.drops.get(node, 1) - 1))
        return self.formed_at + self.rules.rejoin_delay_s * float(2**doublings)

    def held_until(self, now: float) -> dict[int, float]:
        """The nodes held back now, each with when it may restart the round (inf: never)."""
        return {n: self._hold_end(n) for n in self._held(now)}

    def _held(self, now: float) -> set[int]:
        """Returning nodes that may not yet restart the healthy current round."""
        if self.current is None or self.stale:
            return set()
        return {n for n in self._returning if n in self.pending and now < self._hold_end(n)}

    def _next_hold_end(self, now: float) -> float | None:
        """When the next held-back node may restart the round (none: ``rejoin_delay=never``
        holds them as spares until the round breaks anyway)."""
        ends = [end for end in map(self._hold_end, self._held(now)) if math.isfinite(end)]
        return min(ends) if ends else None

    def _pend(self, req: JoinRequest) -> None:
        old = self.pending.get(req.node)
        if old is None:
            if self.current is not None and req.node in self.current.member_set:
                self._rejoined += 1
                self._member_joined = True
        elif old.history is not None and old.history is self._latest:
            self._latest, self._latest_known = None, False
        self.pending[req.node] = req  # a node that joins again keeps its place in arrival order
        hist, latest = req.history, self._latest
        if self._latest_known and hist is not None and hist.newer_than(latest):
            self._latest = hist

    def _unpend(self, node: int) -> JoinRequest | None:
        req = self.pending.pop(node, None)
        self.abstained.discard(node)
        if req is not None:
            if self.current is not None and node in self.current.member_set:
                self._rejoined -= 1
            if req.history is not None and req.history is self._latest:
                self._latest, self._latest_known = None, False
        return req

    def check(self) -> list[str]:
        """Where what the book keeps to answer in O(1) disagrees with a count from scratch over
        its state (empty: nowhere). The kept values are the joiners in the running round
        (``_rejoined``), the newest history a joiner reported (``_latest``), the running
        round's history, the base's members a re-rendezvous waits for, and the cursor of
        ``all_gone``; and the ledger's standings agree (``Ledger.check``). The swarm asks after
        every step of the agents (invariant ``book``); the unit tests after every operation."""
        problems: list[str] = self.ledger.check()
        members = self.current.member_set if self.current is not None else frozenset()
        rejoined = len(self.pending.keys() & members)
        if self._rejoined != rejoined:
            problems.append(f"_rejoined is {self._rejoined}, {rejoined} joiners are in the running round")
        histories = [r.history for r in self.pending.values() if r.history is not None]
        newest = max(histories, key=lambda h: (h.round, h.epoch, -h.term[1]), default=None)
        latest = self._latest_history()
        if (latest.key if latest else None) != (newest.key if newest else None):
            problems.append(f"the newest history kept is {latest}, the joiners report {newest}")
        current = History.of(self.current) if self.current is not None else None
        kept = self._current_history
        if (kept.key if kept else None) != (current.key if current else None):
            problems.append(f"the running round's history kept is {kept}, the round is {current}")
        source = self.base()
        if source is not None and self.leader in self.pending:
            base = set(source.members)
            if source.epoch != self.epoch and source.members and source.members[0] != self.leader:
                base.discard(source.members[0])
            expected = (base - self.ledger.out_of(base)) | {self.leader} <= self.pending.keys()
            if self._expected_joined() != expected:
                problems.append(f"every node of the base joined: kept {not expected}, counted {expected}")
        gone = not (self.tracked() - {self.leader})
        if self.all_gone() != gone:
            problems.append(f"all gone: kept {not gone}, counted {gone}")
        return problems

    def _latest_history(self) -> History | None:
        """The newest round a joiner reported (the first joiner's, of several equal ones)."""
        if not self._latest_known:
            histories = [r.history for r in self.pending.values() if r.history is not None]
            self._latest = max(histories, key=lambda h: (h.round, h.epoch, -h.term[1]), default=None)
            self._latest_known = True
        return self._latest

    def _previous_members(self) -> tuple[int, ...] | None:
        """The base's members (see ``base``)."""
        base = self.base()
        return base.members if base is not None else None

    def _rank_order(self) -> tuple[int, ...]:
        previous = self._previous_members() or ()
        return rank_order(self.leader, self.pending, previous, self.rules.max_nodes)

    def _expected_joined(self) -> bool:
        """True when every live node of the last round (re-)joined; the leader's own join is
        checked before. Counts first: until the last few joins, a decision costs O(1)."""
        base = self._expected_base()
        if base is None:
            return False  # first round of the job: wait for the last call like c10d
        pending, ledger = self.pending, self.ledger
        if len(base) > len(pending) + ledger.out_count():
            return False
        return all(n in pending or not ledger.live(n) for n in base)

    def _expected_base(self) -> frozenset[int] | None:
        """The last round's members (its leader left out after a failover), cached per round or
        history; ``_expected_joined`` excuses the dead and the left among them."""
        source: Round | History | None = self.base()
        if source is None:
            return None
        if self._base is None or self._base[0] is not source:
            base = set(source.members)
            if (
                isinstance(source, History)
                and source.epoch != self.epoch
                and source.members
                and source.members[0] != self.leader
            ):
                base.discard(source.members[0])  # that round's leader is why there is a new term
            self._base = (source, frozenset(base))
        return self._base[1]

    def _waiting(self, now: float) -> int:
        if self.closed:
            return 0
        if self.current is None:
            return len(self.pending)
        members = self.current.member_set
        rejoining = self._rejoined
        # Held nodes are joiners outside the round (returning ones, see ``join``).
        newcomers = len(self.pending) - rejoining - len(self._held(now))
        live_size = len(members) - len(self.ledger.out_of(members))
        room = max(0, self.rules.max_nodes - live_size)
        return rejoining + min(newcomers, room)
