"""What a term knows of the job's other terms (``_others.OtherTerms``): which rounds heard of
leave no quorum to count (``unaccounted``)."""

from __future__ import annotations

from torch_mingle._others import OtherTerms
from torch_mingle._records import NOTHING_HEARD, History

A, B, C, X = 0xA1, 0xB2, 0xC3, 0xD4
TERM = (3, C)  # the term that asks


def _others(*heard: tuple[int, ...]) -> OtherTerms:
    return OtherTerms(heard=NOTHING_HEARD.with_keys(*heard))


def test_a_round_heard_of_below_the_first_round_of_every_line_of_the_base_is_of_none_of_them() -> None:
    # The base is the first round of its line (numbered 2: it knew a round 1 ran, not whose);
    # an island's round 1, heard of later, is no ancestor of it (seed 62037362).
    base = History(epoch=2, round=2, members=(B, C), lines=((2, B, 2), (1, B, 1)))
    assert _others((1, X, 1)).unaccounted(base, [], TERM) == (1, X, 1)
    # Once one of its members joined and reported it, its voters are known.
    island = History(epoch=1, round=1, members=(X,), lines=((1, X, 1),))
    assert _others((1, X, 1)).unaccounted(base, [island], TERM) is None


def test_a_round_of_a_line_the_base_continues_is_accounted_for_whatever_its_number() -> None:
    base = History(epoch=2, round=7, members=(B, A), lines=((1, A, 1),))
    # The line's first round, and a later round of it, below the base.
    assert _others((1, A, 1)).unaccounted(base, [], TERM) is None
    assert _others((1, A, 4)).unaccounted(base, [], TERM) is None
    # Numbered as the base or above, and not the base: unaccounted, as before.
    assert _others((1, X, 7)).unaccounted(base, [], TERM) == (1, X, 7)


def test_a_proposal_of_the_bases_own_term_is_of_its_chain() -> None:
    # Seed 1772: the base's term proposed round 5, which did not form, then founded its line at 6.
    base = History(epoch=2, round=7, members=(B, A), lines=((2, B, 6),))
    assert _others((2, B, 5)).unaccounted(base, [], TERM) is None
    assert _others((1, X, 5)).unaccounted(base, [], TERM) == (1, X, 5)


def test_where_the_base_names_no_lines_only_rounds_numbered_as_it_or_above_count() -> None:
    base = History(epoch=2, round=2, members=(B, C))
    assert _others((1, X, 1)).unaccounted(base, [], TERM) is None
    assert _others((1, X, 2)).unaccounted(base, [], TERM) == (1, X, 2)


def test_a_round_that_says_its_line_is_judged_by_it_not_by_its_number() -> None:
    # The base names the proposal it accounted for (1, B, 1): a number rule would take an
    # island's round 2 for a round of that line. Said to be of the island's line, it is not.
    base = History(epoch=2, round=3, members=(B, C), lines=((2, B, 2), (1, B, 1)))
    assert _others((1, X, 2, 1, X, 1)).unaccounted(base, [], TERM) == (1, X, 2)
    # A later round of a line the base took in is of it, whatever its number.
    took_in = History(epoch=2, round=9, members=(B, C), lines=((2, B, 2), (1, X, 1)))
    assert _others((1, X, 5, 1, X, 1)).unaccounted(took_in, [], TERM) is None


def test_a_round_of_a_rivals_line_is_accounted_for_by_the_rival() -> None:
    # Seed 63008909: two lines met; the base is the other line's newest round, and this
    # side's round 3 (its line (1, A, 1)) is accounted for by its rival round 4, whose majority
    # the next round needs too.
    base = History(epoch=3, round=6, members=(B, C), lines=((2, B, 1),))
    rival = History(epoch=4, round=4, members=(A, X), lines=((1, A, 1),))
    assert _others((3, 0xE5, 3, 1, A, 1)).unaccounted(base, [rival], TERM) is None
    assert _others((3, 0xE5, 3, 1, X, 1)).unaccounted(base, [rival], TERM) == (3, 0xE5, 3)


def test_a_node_keeps_every_line_it_heard_of_and_one_round_of_each() -> None:
    """Swarm seed 70007446: five sides of a split at the start each formed a round 1, and one
    of them a round 2 that continues its line. Kept four per term, the oldest island's round
    fell out of what a node heard of, and a term formed a round beside it: the next round must
    find each island unaccounted for, and a line's older round is its newer one's."""
    islands = [(1, 0x10 + i, 1) for i in range(5)]
    line = (1, 0x10, 1)
    heard = NOTHING_HEARD.with_keys(*((*i, *i) for i in islands), (4, 0x10, 2, *line), (3, 0x10, 1, *line))
    assert len(heard.keys) == 5  # the line's older rounds gave way to its round 2
    assert (4, 0x10, 2) in heard.keys and (1, 0x10, 1) not in heard.keys and (3, 0x10, 1) not in heard.keys
    base = History(epoch=5, round=2, members=(B, C), lines=((5, B, 1),))
    for island in islands[1:]:
        assert OtherTerms(heard=heard).unaccounted(base, [], TERM) is not None
        known = [History(epoch=1, round=1, members=(i[1],), lines=(i,)) for i in islands[1:] if i != island]
        known.append(History(epoch=4, round=2, members=(0x10,), lines=(line,)))
        assert OtherTerms(heard=heard).unaccounted(base, known, TERM) == island
