"""The two phases of a round, the rule that both sides apply: a leader forms a proposal once
``quorum_met``; a member votes for one only if ``may_accept``.

A round after the first is formed from a *base*: the newest round the leader knows to have
formed. It is first *proposed*: the members of the new round and the voters of the base (its
members, but those that left: ``_ledger``) each record it (``accepted``, written to their state
file before they answer) and answer ``accept``; it is *formed* once a majority of the base's
voters accepted it. A node accepts only from the leader it follows, and only a proposal that
accounts for what it accepted before. A proposal that some joiner accepted from another term,
newer than the base, may have formed without our knowing: a majority of its voters must accept
ours too (``Form.constraints``). So any two rounds that form from one base share a node that
accepted both, and the second one's leader knew of the first. A job's *first* round forms once
every one of its members accepted it (``Form.unanimous``).
"""

from __future__ import annotations

from collections.abc import Collection

from torch_mingle._records import History


def quorum_met(
    constraints: tuple[frozenset[int], ...],
    accepted: set[int],
    counts: Collection[int] | None = None,
    *,
    every: bool = False,
) -> bool:
    """Whether the nodes that ``accepted`` a proposal hold a strict majority of every voter set
    it must win (``Form.constraints``), and, with ``every``, all of the first one (a round
    formed from no base, whose members must each know of it, ``Form.unanimous``): then the
    round is formed. ``counts``: how many
    of each voter set accepted, where the caller keeps them per accept (``_proposals.Proposal``).

    Invariant: two proposals that both meet a voter set's majority share a node that accepted
    both, and a node accepts a second only if its leader accounted for the first
    (``may_accept``): so no two rounds form from one base without the second knowing of the first.
    """
    have = list(counts) if counts is not None else [len(voters & accepted) for voters in constraints]
    met = [2 * n > len(voters) for n, voters in zip(have, constraints, strict=True)]
    if every and constraints:  # the first set is the round's own members: all of them
        met[0] = have[0] == len(constraints[0])
    return all(met)


def may_accept(
    history: History | None,
    accepted: History | None,
    proposal: History,
    base: int,
    covers: frozenset[tuple[int, int, int]],
    earlier: tuple[History, ...] = (),
) -> bool:
    """Whether a node that knows ``history`` formed, and accepted ``accepted`` (and before it
    the ``earlier`` votes of other terms it replaced), may accept ``proposal`` (formed from
    round ``base``, accounting for the proposals ``covers``).

    Invariant: a node never accepts a proposal whose leader did not know what the node knows:
    a round it knows formed must be older than the proposal and no newer than its base (a
    proposal built on an older base was made without it: the node's accept of that round is
    cleared once the round reaches it), and each proposal it accepted, its vote and the earlier
    ones, must be the same term's, no newer than the proposal's base on a line the proposal
    continues, or accounted for. An earlier one too: it may have formed, and a later vote's
    proposal built on it says only that its own leader knew it (seed 70000136: a proposal that
    covered only that later vote, built on an older base, won its base beside it).
    """
    if history is not None and (not proposal.newer_than(history) or history.round > base):
        return False
    return all(_accounted(vote, proposal, base, covers) for vote in (accepted, *earlier))


def _accounted(
    vote: History | None, proposal: History, base: int, covers: frozenset[tuple[int, int, int]]
) -> bool:
    """Whether ``proposal`` (from round ``base``, covering ``covers``) accounts for ``vote``: a
    base numbered as high as the vote counts only on the vote's line (a round of another line
    numbered as high says nothing of it: seed 71000544, a vote for an island's first round and
    a proposal from the other island's round 1, sent as the voter said hello)."""
    if vote is None or vote.term == proposal.term:
        return True
    if vote.round <= base and _on_its_line(vote, proposal):
        return True
    # Accounted for: that proposal, or a later one of its term (a leader forms none of its own
    # proposals once it proposed a later one), covered or a line the proposal continues: a line
    # is named by its first round, which its term proposed with no round of its own formed
    # (seed 72014687: a vote for a first round that never formed, whose leader then formed its
    # round 2 alone, refused every proposal built on that round 2, and the job never formed).
    epoch, leader, number = vote.key
    return any(e == epoch and l_ == leader and n >= number for e, l_, n in (*covers, *proposal.lines))


def _on_its_line(vote: History, proposal: History) -> bool:
    """Whether ``proposal`` continues (or took in) the line of ``vote``; where either names no
    lines (a release before lines), the number alone decides, as it did."""
    return not vote.lines or not proposal.lines or vote.lines[0] in proposal.lines
