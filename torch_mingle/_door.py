"""The connections to a leader's control port that have not said hello yet, per source address.

Beyond ``MAX_UNIDENTIFIED`` of them, one gives way to each new one: the oldest of the address
that holds the most (``give_way``), unless that is the new one's own address (then the new one
is refused, first come first served, as a herd of one host's nodes wants). A node's hello takes
milliseconds, so a host that opens connections and never says hello (it lacks the secret) only
ever pushes out its own, and never keeps out a node connecting from elsewhere.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from torch_mingle._member import ConnId, Member
from torch_mingle._settings import Difference, describe_differences

log = logging.getLogger(__name__)

MAX_UNIDENTIFIED = 1024
#: A node refused for its settings is named in the leader's log at most this often ...
MISFIT_LOG_INTERVAL_S = 60.0
#: ... and so many such nodes are remembered for that.
MAX_MISFITS = 64


class Door:
    def __init__(self) -> None:
        self._waiting: dict[str, dict[ConnId, Member]] = {}
        self.count = 0
        #: Nodes refused for their settings, and when the log last named each.
        self._misfits: OrderedDict[int, float] = OrderedDict()

    def misfit(self, label: str, node: int, ip: str, diffs: tuple[Difference, ...], now: float) -> None:
        """``node`` said hello with settings that differ from the job's: it was refused; say so."""
        last = self._misfits.get(node)
        if last is not None and now - last < MISFIT_LOG_INTERVAL_S:
            return
        self._misfits[node] = now
        self._misfits.move_to_end(node)
        while len(self._misfits) > MAX_MISFITS:
            self._misfits.popitem(last=False)
        log.warning(
            "%s refused node %016x at %s: %s", label, node, ip, describe_differences(diffs, "that node")
        )

    def full(self) -> bool:
        return self.count >= MAX_UNIDENTIFIED

    def add(self, m: Member) -> None:
        """``m``, just accepted, has not said hello."""
        assert m.conn is not None  # noqa: S101 - accepted members have a connection
        self._waiting.setdefault(m.source, {})[m.conn] = m
        self.count += 1

    def passed(self, m: Member) -> None:
        """``m`` said hello, or is gone: no longer among the unidentified connections."""
        waiting = self._waiting.get(m.source)
        if waiting is None or m.conn is None or waiting.pop(m.conn, None) is None:
            return
        self.count -= 1
        if not waiting:
            del self._waiting[m.source]

    def give_way(self, source: str) -> tuple[Member, int] | None:
        """Which connection gives way to a new one from ``source``, and how many its address
        holds; None: nothing gives way (``source`` holds the most itself)."""
        busiest = max(self._waiting.values(), key=len)
        if len(self._waiting.get(source, ())) >= len(busiest):
            return None
        return next(iter(busiest.values())), len(busiest)
