"""What a leader's term knows of the job's other terms, and the rules that read it.

Three things, each newest per term: the rounds of the job that the term's nodes heard of
(``heard``: by any authentic word, as a spare that followed a leader which announced one),
the proposals of other terms that its joiners accepted (``reported``), and the rounds of other
terms its joiners were in (``lines``). Four rules read them, and nothing else in the package
does: a proposal newer than the base may have formed, so the next round must win a majority of
its voters too (``uncertain``); a round of another line of the job (two sides of a split at its
start each founded one) may go on, so it needs its majority too (``rivals``); a round heard of
whose members no joiner reported leaves no quorum to count (``unaccounted``); and a term that
learns of a round of a term at least as new as itself gives way, or the fencing token would go
back (``outdated_by``). ``RoundBook`` asks them with its base.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from torch_mingle._keys import RoundKey, age
from torch_mingle._record import field, record
from torch_mingle._records import MAX_LINES, NOTHING_HEARD, Heard, History, Lines

#: Proposals (and rounds) of other terms a leader keeps account of (the newest ones win a place).
MAX_REPORTED = 64


def _other_line(h: History, base: History) -> bool:
    """Whether round ``h`` is of a line that ``base`` does not continue: by the lines they name,
    or, where one names none, by number (one numbered below the base may be its ancestor). A
    round or proposal of the base's own term is not: a term's rounds form one chain, and a
    proposal it made before the base did not form (it went on to propose another)."""
    if h.term == base.term:
        return False
    if h.lines and base.lines:
        return h.lines[0] not in base.lines
    return h.round >= base.round


def _may_be_in(key: RoundKey, base: History, line: RoundKey | None, lines: Collection[RoundKey]) -> bool:
    """Whether round ``key``, numbered below ``base``, is of a line the next round accounts
    for: one of the base's own term (a term's rounds and proposals form one chain), or one of
    ``lines`` (the base's, and those of the rivals and proposals whose majority the next round
    needs too), by the line its sayer said it is of (``line``, ``Heard.lines``). Where
    nobody said (a round heard of from a version that did not), one numbered above the first
    round of one of the base's lines may be (a line's rounds are numbered upward from its
    first). Seed 62037362: an island's round 1, heard of by a spare once the others had formed
    their round 2, was taken for an ancestor of their round 3 by its number, and the island
    trained beside it; a later island round numbered above a line of the base would pass a
    rule of numbers alone."""
    if key[:2] == base.term:
        return True
    if line is not None:
        return line in lines
    return any(key[2] > first[2] for first in base.lines)


def _newest_per_line(rounds: list[History]) -> list[History]:
    """``rounds``, each once, and of the rounds of one line (by the line they name) only the
    newest: a line's later round was formed by a majority of the one before, so no other round
    of that line can form from the older one (rounds that name no line are each kept)."""
    newest: dict[object, History] = {}
    for h in rounds:
        line: object = h.lines[0] if h.lines else h.key
        old = newest.get(line)
        if old is None or h.newer_than(old):
            newest[line] = h
    return list(newest.values())


def join_lines(*groups: Lines) -> Lines:
    """The lines of ``groups``, in order, each once, at most ``MAX_LINES``: the first (the
    round's own line) and the newest others (the oldest go first)."""
    out: list[RoundKey] = []
    for group in groups:
        out += [k for k in group if k not in out]
    return tuple(out[:1] + out[1:][-(MAX_LINES - 1) :]) if len(out) > MAX_LINES else tuple(out)


@record(frozen=False)
class OtherTerms:
    #: The rounds of the job that the leader's node and its joiners heard ran: one that no
    #: joiner reports, newer than the base or of its number, leaves no quorum (``unaccounted``).
    heard: Heard = NOTHING_HEARD
    #: Proposals of other terms that joiners accepted, newest per term (epoch, leader): kept for
    #: the whole term (what a node reported stays known when it withdraws).
    reported: dict[tuple[int, int], History] = field(default_factory=dict)
    #: Rounds of other terms that joiners were in, newest per term, kept as ``reported``: one
    #: numbered as the base or above that is not the base is of another line (a split at the
    #: job's start), and may go on: the next round needs a majority of it too (``rivals``).
    lines: dict[tuple[int, int], History] = field(default_factory=dict)
    #: The highest epoch of a round another term formed or proposed that a joiner reported,
    #: whatever its lineage (``outdated_by``).
    reported_epoch: int = 0

    def hear(self, heard: Heard) -> bool:
        """Rounds of the job formed: a node of this term heard of them (``heard``); True if
        that is news."""
        old, self.heard = self.heard, self.heard.with_heard(heard)
        return self.heard != old

    def ran(self, history: History, base: Callable[[], History | None]) -> None:
        """A joiner's last round, of another term: the next round may have to account for it."""
        self.reported_epoch = max(self.reported_epoch, history.epoch)
        self._keep(self.lines, history, base)

    def accepted(self, proposal: History, base: Callable[[], History | None]) -> None:
        """A proposal of another term that a joiner accepted: the next round must account for it."""
        self.reported_epoch = max(self.reported_epoch, proposal.epoch)
        self._keep(self.reported, proposal, base)

    def _keep(
        self, kept: dict[tuple[int, int], History], h: History, base_of: Callable[[], History | None]
    ) -> None:
        """Keep ``h``, the newest of its term, in ``kept`` (``reported``, ``lines``): at most
        ``MAX_REPORTED``, forgetting first those the base (``base_of()``) is already newer than."""
        old = kept.get(h.term)
        if old is None or h.round > old.round:
            kept[h.term] = h
            if len(kept) > MAX_REPORTED:
                base = base_of()
                for term in [t for t, p in kept.items() if not p.newer_than(base)]:
                    del kept[term]
                while len(kept) > MAX_REPORTED:
                    del kept[min(kept, key=lambda t: age(kept[t].key))]

    def uncertain(self, base: History | None) -> list[History]:
        """Proposals of other terms, newer than the ``base``, that joiners accepted: each may have
        formed without this leader knowing, so the next round must win a majority of its voters too."""
        return [p for p in self.reported.values() if p.newer_than(base)]

    def rivals(self, base: History | None, own: History | None) -> list[History]:
        """Rounds of another line of the job (two sides of a split at the job's start each
        founded one, and met) that joiners were in, or accepted as proposals: each may go on
        where its other members are, so the next round must win a majority of its voters too,
        as of an ``uncertain`` proposal, and its line is then the new round's (``Round.lines``).
        Another line's is a round of a line the base does not continue, or, where a round does
        not name its lines, one numbered as the base or above that is not the base. ``own``: the
        term's own current round."""
        if base is None:
            return _newest_per_line(list(self.lines.values()))
        heard = set(self.heard.keys)
        # The term's own round too, when the base is of another line (a joiner of that line
        # brought a higher round number): its line may go on where its other members are.
        kept = [*self.lines.values(), *([own] if own is not None else [])]
        found = [h for h in kept if h.key != base.key and _other_line(h, base)]
        # A proposal a joiner accepted, not newer than the base (``uncertain`` counts those), of
        # another line: it may have formed (seed 5003241: a first round whose member was cut
        # off once it accepted formed on the other side, and that member was taken into a round
        # of another line). Where rounds name no lines, only one heard to have formed beside it.
        found += [
            p
            for p in self.reported.values()
            if p.key != base.key
            and not p.newer_than(base)
            and _other_line(p, base)
            and (p.key in heard or (p.lines and base.lines))
        ]
        return _newest_per_line(found)

    def unaccounted(
        self, base: History | None, known: Iterable[History], term: tuple[int, int]
    ) -> RoundKey | None:
        """A round of the job that the term heard of (``heard``) and cannot count a quorum of: of
        another term, numbered as the base or above or of no line the next round accounts for
        (``_may_be_in``), neither the base nor a round or proposal a joiner reported (``known``).
        Its members are unknown: they may train beside the next round, and only one of them,
        joining, tells who votes (seed 29186: one side of a one-way split at the job's start
        heard the other's round 1 and formed its round 2)."""
        floor = base.round if base is not None else 0
        known = list(known)
        # A round is accounted for by a round or proposal that continues its line or took it in.
        known_keys = {h.key for h in known}.union(*(h.lines for h in known), base.lines if base else ())
        # Below the base too, where it names its lines: a round of none of them is no ancestor.
        named = base is not None and bool(base.lines)
        for key in self.heard.beyond(0 if named else floor, term, base.key if base else None).keys:
            if key in known_keys:
                continue
            if (
                base is None
                or key[2] >= floor
                or not _may_be_in(key, base, self.heard.line_of(key), known_keys)
            ):
                return key
        return None

    def outdated_by(self, base: History | None, term: tuple[int, int]) -> int | None:
        """The epoch of another term, at least as new as ``term`` (this one), that formed or
        proposed a round this leader knows of (None if none): this term must give way to a newer
        one, or the fencing token (epoch, round) of its next round would go back."""
        epoch = term[0]
        for h in (base, *self.uncertain(base)):
            if h is not None and h.term != term and h.epoch >= epoch:
                return h.epoch
        # A joiner that ran a round of a higher epoch elsewhere (a side that started apart, before
        # the job's first round reached it): our round, of a lower epoch, would be its token going
        # back. (Of the same epoch it cannot: our round numbers pass every round reported.)
        if self.reported_epoch > epoch:
            return self.reported_epoch
        return None
