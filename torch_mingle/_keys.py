"""A round's key, (epoch, leader, number), and the job's order of keys."""

from __future__ import annotations

#: A round (or a proposal) of the job: the epoch and the leader of the term that proposed it,
#: and its number.
RoundKey = tuple[int, int, int]


def newest_key(*keys: RoundKey | None) -> RoundKey | None:
    """The newest of round keys, in ``History.newer_than``'s order (round, then epoch); None if
    none is known."""
    known = [k for k in keys if k is not None]
    return max(known, key=age) if known else None


def age(key: RoundKey) -> tuple[int, int, int]:
    """A round key's place in the job's order (``History.newer_than``): round, epoch, then leader."""
    return (key[2], key[0], -key[1])
