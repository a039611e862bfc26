"""The order of places: the one rule the leader sorts members' places by (``natural_key``),
and the bound on a place's length. Pure; ``_order`` computes a node's place from its
``rank_order`` policy and environment."""

from __future__ import annotations

import re

#: A node's place is a host name or a label, not a text: longer ones are refused.
MAX_PLACE_CHARS = 256

_DIGITS = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that reads digit runs as numbers (``node7`` before ``node66``) and compares
    ``/``-separated parts one by one (``rack2/x`` before ``rack10/a``)."""
    parts: list[tuple[int, int | str]] = []
    for i, part in enumerate(text.split("/")):
        if i:
            parts.append((-1, ""))  # a separator sorts before any character of a part
        for j, piece in enumerate(_DIGITS.split(part)):
            if piece:
                parts.append((0, int(piece)) if j % 2 else (1, piece))
    return tuple(parts)
