"""A node's vote, and what it must not forget across a restart of its agent.

Five values: the newest round the node knows formed (``history``), the newest proposal it
accepted beyond it (``accepted``: its vote, see ``_rounds``), the highest epoch it led
(``led``: a new process starts its election above it, and never leads a term of the same
(epoch, node) as its predecessor's, whose proposals may be out), and the rounds it heard of
(``heard``: a node counted in a round without its vote, as a new member is, knows of that
round only what it heard before it joined; a new process that forgot it would found a job of
its own beside the round, seed 8025425), and whether it left the job (``left``: a leave
takes its vote away, and the others count it gone; a new process of it is a new node, seed
8038304), and the votes of other terms that a later vote replaced before the node knew whether
they formed (``earlier``: one of them may still form, and the node must still name it once it
hears so, seed 40003081). Each change goes to ``persist``: into the step's ``Ready.state``,
which the shell writes (``_identity`` keeps the state file) before anything of that step leaves the node
(``_ready.apply``): a vote sent before it is on the disk is forgotten by a power loss, and a
second round could form from the same base without knowing of the first. A disk that refuses
the state stops the node before anything goes out.
"""

from __future__ import annotations

from collections.abc import Callable

from torch_mingle._keys import RoundKey, age, newest_key
from torch_mingle._quorum import may_accept
from torch_mingle._record import field, record
from torch_mingle._records import MAX_HEARD, NOTHING_HEARD, Heard, History, Round


@record
class NodeState:
    """What a node must not forget across a restart of its agent (``_identity`` keeps it)."""

    history: History | None = None
    accepted: History | None = None
    led: int = 0
    heard: Heard = NOTHING_HEARD
    left: bool = False
    earlier: tuple[History, ...] = ()


#: Earlier votes a node keeps (``Ballot.earlier``): the newest, one per term, as ``MAX_HEARD``.
MAX_EARLIER = MAX_HEARD


#: Where each change goes: on the disk, where a new process of the node finds it, before
#: anything that rests on it leaves the node (``_ready.Ready.state``).
Persist = Callable[[NodeState], None]


@record(frozen=False)
class Ballot:
    history: History | None = None
    accepted: History | None = None
    led: int = 0
    heard: Heard = NOTHING_HEARD
    left: bool = False
    #: Votes of other terms that a later vote replaced, newest first, each newer than
    #: ``history``: kept until the node hears which of them formed (``settle``).
    earlier: tuple[History, ...] = ()
    #: Where each change goes before the node acts on it.
    persist: Persist = field(default=lambda state: None, repr=False, compare=False)

    @classmethod
    def of(cls, state: NodeState | None, persist: Persist) -> Ballot:
        state = state or NodeState()
        return cls(state.history, state.accepted, state.led, state.heard, state.left, state.earlier, persist)

    def state(self) -> NodeState:
        return NodeState(self.history, self.accepted, self.led, self.heard, self.left, self.earlier)

    def own_key(self) -> RoundKey | None:
        """The newest round this node was in or voted for: where its departure counts."""
        return newest_key(*(h.key for h in (self.history, self.accepted) if h is not None))

    def may_accept(self, rnd: Round, base: int, covers: frozenset[RoundKey]) -> bool:
        """Whether the proposal ``rnd`` accounts for what this node knows (``_quorum.may_accept``)."""
        return may_accept(self.history, self.accepted, History.of(rnd), base, covers, self.earlier)

    def told(self) -> tuple[History, ...]:
        """The votes its later ones replaced that a node tells a leader, with its vote (its joins,
        its refusals): each may have formed, and the next round must account for it as for the
        vote (``RoundBook.votes_told``; ``may_accept`` refuses a proposal that does not)."""
        return self.earlier

    def votes(self) -> bool:
        """Whether this node still votes: not once it said it leaves. Its leave took its vote
        (the leader that heard it counts it gone); a vote for a proposal that crossed the leave
        on the way, counted by a term that never heard the leave, could form a second round
        from the base the others form without it (seeds 9001332, 9001558)."""
        return not self.left

    def accept(
        self, rnd: Round, base: int, covers: frozenset[RoundKey], heard: Heard = NOTHING_HEARD
    ) -> bool:
        """Record the proposal ``rnd`` as this node's vote (on the disk before the vote goes
        out), if it may and it still votes; False: no vote. ``heard``: what the node heard of
        by now (a vote it cast before for a round heard to have formed is its last round first,
        ``settle``)."""
        settled = self.settle(heard)
        if not self.votes() or not self.may_accept(rnd, base, covers):
            if settled:
                self.persist(self.state())
            return False
        vote = History.of(rnd)
        self.earlier = self._keep(self.accepted, vote)
        self.accepted = vote
        self.persist(self.state())
        return True

    def _keep(self, replaced: History | None, vote: History) -> tuple[History, ...]:
        """``earlier`` once the vote ``replaced`` gives way to ``vote``: a vote of another term
        may still form (its leader may have counted a majority already), and the node that
        heard it formed must then name it (``settle``). Its own term's later proposal ends it:
        a leader forms none of its proposals once it made a later one."""
        if replaced is None or replaced.term == vote.term:
            return self.earlier
        kept: dict[tuple[int, int], History] = {}
        for h in (replaced, *self.earlier):
            kept.setdefault(h.term, h)
        return tuple(sorted(kept.values(), key=lambda h: age(h.key), reverse=True)[:MAX_EARLIER])

    def settle(self, heard: Heard) -> bool:
        """Take the proposal this node accepted as its last round if it heard that it formed
        (``heard``, or what it remembered); True if it did. A heard key names a round that
        formed (``Heard``), and a term never gives two proposals one number
        (``RoundBook.proposed``), so the members are the ones it voted with. Without this, a
        node cut off before the round's "formed" reached it keeps an older round as its last,
        and its next vote replaces the only record of the round it was in: a term that heard of
        that round then finds none of its members, and no quorum forms again (seed 30071042).
        A vote that a later one of another term replaced (``earlier``) counts the same: the
        proposal that replaced it covered it, and the round may have formed all the same (seed
        40003081). The caller writes the change (with its own)."""
        known = (*heard.keys, *self.heard.keys)
        formed = [
            h
            for h in (self.accepted, *self.earlier)
            if h is not None and h.key in known and h.newer_than(self.history)
        ]
        if not formed:
            return False
        self._last_round(max(formed, key=lambda h: age(h.key)))
        return True

    def _last_round(self, history: History) -> None:
        """``history`` is the newest round this node knows formed: a vote no newer is over."""
        self.history = history
        if self.accepted is not None and not self.accepted.newer_than(history):
            self.accepted = None
        self.earlier = tuple(h for h in self.earlier if h.newer_than(history))

    def formed(self, rnd: Round, heard: Heard | None = None) -> None:
        """The round ``rnd`` formed with this node in it. ``heard``: what the node heard of by
        now, written with it (``remember``)."""
        self._last_round(History.of(rnd))
        self.heard = heard if heard is not None else self.heard
        self.persist(self.state())

    def lead(self, epoch: int) -> None:
        """This node leads a term of ``epoch`` (its announcements rest on it)."""
        self.led = max(self.led, epoch)
        self.persist(self.state())

    def remember(self, heard: Heard) -> None:
        """The rounds this node heard of (``heard``), on the disk before it offers itself to a
        round: a round may count it as a member without its vote, and a new process of it must
        still know of what it knew then (``OtherTerms.unaccounted``). Written only when it
        changed (at most once per round of each term). An accepted proposal heard to have
        formed becomes its last round with it (``settle``)."""
        settled = self.settle(heard)
        if heard != self.heard or settled:
            self.heard = heard
            self.persist(self.state())

    def leave(self) -> None:
        """This node leaves the job: on the disk before its leave goes out, for the others
        count it gone and form the next round without its vote; a new process of it that took
        the vote back (a host that lost power as it left) could form another round from the
        same base with nodes that left too (seed 8038304). A new process of a node that left is
        a new node (``_identity``)."""
        if not self.left:
            self.left = True
            self.persist(self.state())
