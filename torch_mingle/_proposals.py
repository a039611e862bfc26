"""A leader's two-phase round: what it decides, proposes, counts and forms.

The term decides on its book (``RoundBook.decide``): wait, or form the round ``Form`` names.
A round is first *proposed* on the spare store, to its members and to the voters it must win
(``Form.constraints``); it forms once ``quorum_met`` (``Proposal.accept`` counts per accept, not
per voter set: a round of 16,384 members gets 16,384 accepts), and every member's join is then
answered with it, the status it runs under inside. A proposal stands while the decision keeps
its voters, its covers and its members (``Proposal.stands``); otherwise it is withdrawn and its
store serves the next one. A refusal teaches the book what the node knows, and the term
decides again.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from torch_mingle import _failpoints
from torch_mingle._claims import Claim
from torch_mingle._frames import Accept, JoinAnswer, Propose, RoundFormed
from torch_mingle._keys import RoundKey
from torch_mingle._member import ConnId, Member, status_key
from torch_mingle._notes import Note, Sink
from torch_mingle._ports import StorePorts
from torch_mingle._quorum import quorum_met
from torch_mingle._record import field, record
from torch_mingle._records import History, Round, WaitKind, node_hex
from torch_mingle._rounds import Form, RoundBook
from torch_mingle._wire import dumps_compact, frame_digest

log = logging.getLogger(__name__)


@record(frozen=False)
class Proposal:
    """A round proposed and not formed yet: who accepted it, and the connections it went to."""

    round: Round
    form: Form
    port: int
    accepted: set[int] = field(default_factory=set)
    sent: set[ConnId] = field(default_factory=set)
    #: Per voter set of ``form.constraints``: how many of its voters accepted (a count per
    #: accept, not a pass over every voter set: a round of 16,384 members gets 16,384 accepts).
    _have: list[int] = field(default_factory=list)

    def accept(self, node: int) -> bool:
        """``node`` accepted; True once the round may form (``quorum_met``)."""
        constraints = self.form.constraints
        if not self._have:
            self._have = [0] * len(constraints)
        if node not in self.accepted:
            self.accepted.add(node)
            for i, voters in enumerate(constraints):
                if node in voters:
                    self._have[i] += 1
        return quorum_met(constraints, self.accepted, self._have, every=self.form.unanimous)

    def stands(self, form: Form) -> bool:
        """Whether the proposal stands against the newer decision ``form``: the same voters to
        win and the same rounds to cover, and every member still in it. Nodes that joined since
        wait for the next round (as they would after it formed): proposing again for each join
        that trickles in would send every member the round again, and might never form it. A
        first round's voters are its members, so one that gains a member is proposed again."""
        f = self.form
        return (f.constraints, f.covers) == (form.constraints, form.covers) and (
            f.members == form.members or set(f.members) <= set(form.members)
        )


class Term(Protocol):
    """What the vote reads of its term and asks of it (``_leader.LeaderTerm``)."""

    book: RoundBook
    claim: Claim
    advertised_ip: str
    label: str
    seal_key: bytes | None
    ports: StorePorts
    outdated_by: int | None
    _stopped: bool
    _decide_due: float | None
    _self: Member | None
    _by_node: dict[int, Member]
    _local: list[Any]
    _offer_after_decide: list[Member]

    @property
    def on_event(self) -> Sink: ...
    def _decide(self, now: float) -> None: ...
    def _propose(self, form: Form, port: int, now: float) -> None: ...
    def _out(self, m: Member, frame: bytes, digest: bytes | None = None) -> None: ...
    def _answer(
        self, m: Member, kind: type[JoinAnswer], *, status_text: str | None = None, **fields: Any
    ) -> None: ...
    def _send_members(self, m: Member, rnd: Round) -> None: ...
    def _update_parking(self, now: float) -> None: ...
    def _update_established(self) -> None: ...
    def _mark_status(self, now: float) -> None: ...
    def _may_join_next(self, m: Member) -> bool: ...
    def _offer_spare(self, m: Member) -> None: ...


class Vote:
    """The term's proposal and what its decisions keep between them."""

    def __init__(self) -> None:
        #: The round proposed and not formed yet.
        self.current: Proposal | None = None
        #: A round decided while no store was open: proposed once one is (``job_done``).
        self.wanted: Form | None = None
        #: When the book said to decide again (a last call, a node's hold) when nothing comes.
        self.wait_until: float | None = None
        #: Which join of which process each member of the last round had (``_join``: its join
        #: again, on a new connection, gets that round again).
        self.delivered: dict[int, tuple[int, int]] = {}
        self._quorum_logged = ""
        self._last_call_noted = False

    @property
    def port(self) -> int | None:
        """The proposed round's store (None: nothing is proposed)."""
        return self.current.port if self.current is not None else None

    def decide(self, term: Term, now: float) -> None:
        term._decide_due = None
        if term._stopped:
            return
        _failpoints.hit("leader.decide")
        term.outdated_by = term.book.outdated_by()
        while True:
            decision = term.book.decide(now)
            if not isinstance(decision, Form):
                self.withdraw(term)
                self.wanted = None
                self.wait_until = decision.until
                if decision.kind is WaitKind.NO_QUORUM and decision.reason != self._quorum_logged:
                    self._quorum_logged = decision.reason  # said once, not at every join
                    log.info("%s the next round waits: %s", term.label, decision.reason)
                    term.on_event(Note("quorum_wait", f"waits for a quorum: {decision.reason}"))
                elif decision.kind is WaitKind.LAST_CALL and not self._last_call_noted:
                    self._last_call_noted = True
                    term.on_event(
                        Note("last_call", f"opened the last call of the next round: {decision.reason}")
                    )
                break
            proposal = self.current
            if proposal is not None and proposal.stands(decision):
                break  # already proposed: waiting for its acceptance
            self.withdraw(term)
            port = term.ports.take()
            if port is None:
                self.wanted = decision
                term.ports.wanted_now(stopped=term._stopped)
                self.wait_until = None
                break  # proposed as soon as the store is open (job_done)
            self.wanted = None
            term._propose(decision, port, now)
            if self.current is None:
                continue  # formed at once (a first round): the next decision may be due too
            break
        term._update_parking(now)
        term._mark_status(now)
        # A join that formed a round needs no store ahead; one that still waits does (joins
        # seen in this batch, and every waiting join and running member when a new spare
        # store opened).
        for m in term._offer_after_decide:
            if term._may_join_next(m):
                term._offer_spare(m)
        term._offer_after_decide.clear()

    def propose(self, term: Term, form: Form, port: int, now: float) -> None:
        """Propose the round ``form`` decided: its members and the voters it needs record it
        and answer ``accept``; it forms once ``quorum_met`` (at once when it needs no votes)."""
        rnd = Round(
            number=form.number,
            epoch=term.claim.epoch,
            members=form.members,
            store_ip=term.advertised_ip,
            store_port=port,
            ips=form.ips,
            dports=form.dports,
            pports=form.pports,
            base=form.base_key,
            lines=form.lines,
        )
        term.book.proposed(rnd.number)
        proposal = Proposal(rnd, form, port)
        self.current = proposal
        if not form.constraints:
            self.commit(term, now)
            return
        audience = set(form.members).union(*form.constraints)
        frame = self.frame(proposal)
        digest = frame_digest(frame) if term.seal_key is not None else None
        for node in audience:
            m = term._by_node.get(node)
            if m is not None and m.conn is not None:
                proposal.sent.add(m.conn)
                term._out(m, frame, digest)
        if term.claim.leader in audience:
            term._local.append(Propose(rnd, form.base, frozenset(form.covers)))
        log.debug(
            "%s round %d proposed (%s): %d member(s), %d voter set(s) to win",
            term.label, rnd.number, form.reason, len(form.members), len(form.constraints),
        )  # fmt: skip

    def accepted(self, term: Term, node: int, number: int, now: float) -> None:
        proposal = self.current
        if proposal is None or proposal.round.number != number:
            return  # an answer to a proposal given up since
        if proposal.accept(node):
            self.commit(term, now)
            term._decide(now)

    def refused(self, term: Term, m: Member, refusal: Accept, now: float) -> None:
        """A node did not accept: the proposal did not account for what it knows (a newer round,
        or a proposal of another term it accepted). The book learns it; the leader decides again."""
        history, accepted = refusal.history, refusal.accepted
        assert m.node is not None  # noqa: S101 - only identified members answer proposals
        log.info(
            "%s node %s refused round %s: it knows %s and accepted %s",
            term.label, node_hex(m.node), refusal.round, history, accepted,
        )  # fmt: skip
        term.book.learn(history, accepted, refusal.earlier)
        proposal = self.current
        knows_none = history is None and accepted is None and not refusal.earlier
        if knows_none and proposal is not None and proposal.form.unanimous:
            log.warning(
                "%s node %s refused the first round and knows of no other: it cannot record its "
                "vote (its state directory?); the round forms without it, it joins the next one",
                term.label, node_hex(m.node),
            )  # fmt: skip
            term.book.abstain(m.node)
        if proposal is not None and refusal.round == proposal.round.number:
            self.withdraw(term)  # (a refusal of one given up since changes nothing)
        term._decide(now)

    def withdraw(self, term: Term) -> None:
        """Give up the proposal (the decision changed): its store serves the next one."""
        proposal, self.current = self.current, None
        if proposal is not None:
            term.ports.give_back(proposal.port, stopped=term._stopped)

    def commit(self, term: Term, now: float) -> None:
        """The proposal won its votes: the round is formed and every member's join is answered."""
        proposal, self.current = self.current, None
        assert proposal is not None  # noqa: S101 - called with one
        rnd, port = proposal.round, proposal.port
        term.book.formed(rnd, now)
        # Each member's round carries the status it runs under, so that no status frame
        # follows it (a second read and wake-up on every member as the round starts).
        status = term.book.status(now)
        key, status_json = status_key(status), dumps_compact(status.to_json())
        self.delivered = {}
        for node in rnd.members:
            m = term._self if node == term.claim.leader else term._by_node.get(node)
            if m is not None and m.join_id is not None:
                self.delivered[node] = (m.incarnation, m.join_id)
                if m.conn is not None and m.conn not in proposal.sent:
                    term._send_members(m, rnd)
                term._answer(m, RoundFormed, status_text=status_json, round=rnd)
                m.told = key
        term.ports.formed(port, now)
        term._update_established()
        self._last_call_noted = False
        term.on_event(
            Note(
                "round_complete",
                f"marked round {rnd.number} as complete ({proposal.form.reason})",
                master_endpoint=f"{rnd.store_ip}:{port}",
            )
        )
        log.info(
            "%s round %d formed (%s): world size %d, store port %d, members %s",
            term.label,
            rnd.number,
            proposal.form.reason,
            rnd.world_size,
            port,
            " ".join(node_hex(n) for n in rnd.members),
        )

    def needs_every_vote(self, number: int) -> bool:
        """Whether proposal ``number`` stands and forms only once every member voted (a first
        round: ``Form.unanimous``)."""
        proposal = self.current
        return proposal is not None and proposal.round.number == number and proposal.form.unanimous

    def voted_for(self, node: int) -> RoundKey | None:
        """This term's proposal, if ``node`` accepted it."""
        p = self.current
        return History.of(p.round).key if p is not None and node in p.accepted else None

    @staticmethod
    def frame(proposal: Proposal) -> bytes:
        """The ``propose`` frame of ``proposal`` (the same bytes for every voter)."""
        form = proposal.form
        return Propose(proposal.round, form.base, frozenset(form.covers)).encode()
