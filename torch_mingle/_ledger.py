"""Who is gone: the standing of each node a leader's term knows of, and the rules that read it.

A node of the term is *live* (it runs or waits), *lost* (its connection ended or went silent:
it keeps its vote, whatever ended it, ``_evidence``), *left* (it said so on its own connection:
its ``leave``), or *gone* (it left, as a joiner reported or its ``bye`` said; it is still
counted where it runs, as before). A node that left or is gone has a *departure*, filed under
the newest round it was in or voted for (its own word, or newer: never older), and that
departure takes its vote on that round's successor only (``voters_of``). A join clears the
standing: the node is back. How often each node was lost, and why the last time, is kept
beside it for the hold of a node that keeps returning (``RoundBook._returns_held``).

Nothing else in the package combines these sets: the leader's book asks the rules below.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

from torch_mingle._keys import RoundKey, newest_key
from torch_mingle._record import field, record


@record(frozen=False)
class Ledger:
    lost: set[int] = field(default_factory=set)
    left: set[int] = field(default_factory=set)
    gone: set[int] = field(default_factory=set)
    #: How often each node was lost in this term, and why the last time.
    drops: dict[int, int] = field(default_factory=dict)
    lost_why: dict[int, str] = field(default_factory=dict)
    #: The round each node that left or is gone left (``voters_of``).
    _left_in: dict[int, RoundKey] = field(default_factory=dict)

    # ----------------------------------------------------------------- inputs

    def joined(self, node: int) -> None:
        """``node`` joined: it is back, whatever it was (its drops stay: ``drops``)."""
        self.lost.discard(node)
        self.left.discard(node)
        self.gone.discard(node)
        self._left_in.pop(node, None)

    def reported_gone(self, node: int, key: RoundKey | None) -> None:
        """A joiner reported that ``node`` left round ``key`` (its ``bye`` said so there)."""
        self.gone.add(node)
        self._file(node, key)

    def said_it_left(self, node: int, key: RoundKey | None) -> None:
        """``node`` left by its own word on its connection (``_evidence``), from round ``key``."""
        self.gone.add(node)
        self._file(node, key)

    def leave(self, node: int, key: RoundKey | None) -> None:
        """``node`` leaves the job (its ``leave`` frame) from round ``key``."""
        self.left.add(node)
        self._file(node, key)

    def died(self, node: int, why: str) -> bool:
        """``node`` is lost (it keeps its vote); False if it left already (nothing changes)."""
        if node in self.left:
            return False
        self.lost.add(node)
        self.lost_why[node] = why
        self.drops[node] = self.drops.get(node, 0) + 1
        return True

    def revive(self, node: int) -> None:
        """``node``, counted lost, is in its round after all: its loss is forgotten."""
        if node not in self.lost:
            return
        self.lost.discard(node)
        self.gone.discard(node)
        self._left_in.pop(node, None)
        self.lost_why.pop(node, None)
        if self.drops.get(node, 0) > 1:
            self.drops[node] -= 1
        else:
            self.drops.pop(node, None)

    def forget(self, keep: Collection[int]) -> None:
        """Forget every node but ``keep`` (``RoundBook._forget_strangers``)."""
        for table in (self.drops, self.lost_why, self._left_in):
            for node in [n for n in table if n not in keep]:
                del table[node]
        self.lost &= set(keep)
        self.left &= set(keep)
        self.gone &= set(keep)

    def _file(self, node: int, key: RoundKey | None) -> None:
        key = newest_key(key, self._left_in.get(node))
        if key is not None:
            self._left_in[node] = key

    # ------------------------------------------------------------------ rules

    def live(self, node: int) -> bool:
        """Neither lost nor left: the round and the joins count on it."""
        return node not in self.lost and node not in self.left

    def has_left(self, node: int) -> bool:
        """It said ``leave`` on its own connection: it never comes back in this process."""
        return node in self.left

    def out_of(self, nodes: Collection[int]) -> set[int]:
        """Those of ``nodes`` that are lost or left (``live`` is False); of a set, in the time of
        the few that are out, not of the many that run."""
        out = self.lost | self.left
        if isinstance(nodes, set | frozenset):
            return out & nodes
        return {n for n in nodes if n in out}

    def out_count(self) -> int:
        """How many nodes are lost or left, at most (a bound that costs nothing to read)."""
        return len(self.lost) + len(self.left)

    def departed_of(self, members: Collection[int]) -> list[int]:
        """Those of ``members`` that left or are gone (their departure is filed), sorted."""
        departed = self.left | self.gone
        if isinstance(members, set | frozenset):
            return sorted(departed & members)
        return sorted(n for n in members if n in departed)

    def leavers(self) -> Iterator[int]:
        """The nodes that said ``leave``."""
        return iter(list(self.left))

    def voters_of(self, members: tuple[int, ...], key: RoundKey | None) -> frozenset[int]:
        """Who of the members of round ``key`` votes on the next one: all but those that left it
        (``_evidence``).

        Invariant: a departure is filed under the newest round its node was in or voted for
        (its own word) or a newer one, never an older one: a node that left a later round
        still votes on an older one (its vote there may have formed that later round, and a
        side that dropped it from the older round's voters could form a second successor). A
        departure whose round is unknown counts for no round."""
        left_in = self._left_in
        if not left_in:
            return frozenset(members)
        return frozenset(m for m in members if left_in.get(m) != key)

    def left_in(self, node: int) -> RoundKey | None:
        """The round ``node`` left (None: not known to have left one)."""
        return self._left_in.get(node)

    def check(self) -> list[str]:
        """What disagrees between the standings (empty: nothing): a departure is filed only for
        a node that left or is gone, a lost node has its reason, and a reason its drop."""
        problems = []
        if stray := set(self._left_in) - self.left - self.gone:
            problems.append(f"departures filed for nodes that neither left nor are gone: {sorted(stray)}")
        if unexplained := self.lost - self.lost_why.keys():
            problems.append(f"lost without a reason: {sorted(unexplained)}")
        if uncounted := self.lost_why.keys() - self.drops.keys():
            problems.append(f"a reason without a drop: {sorted(uncounted)}")
        return problems
