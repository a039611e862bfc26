"""The status a leader pushes to its round's members (``status`` frames), and to whom.

Only a member that runs the current round reads the status (``num_nodes_waiting``, closed):
it needs to hear when it must restart or stop, not of every join. So a status goes out, once
per batch, to the members whose answer it changes (``status_key``), and to those that
connected since the last push: with N nodes a round costs O(N) frames, not O(N**2). A
preempted node that left waits, still connected, for the round without it, and hears too.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

from torch_mingle._frames import StatusPush
from torch_mingle._member import Member, status_key
from torch_mingle._records import Status
from torch_mingle._rounds import RoundBook
from torch_mingle._wire import frame_digest

#: Sends a frame (and its digest, with a secret) to a member (``LeaderTerm._out``).
Send = Callable[[Member, bytes, "bytes | None"], None]


class Pusher:
    def __init__(self) -> None:
        self._key: tuple[object, ...] | None = None
        #: Members that said hello since the last push (they may not have been told).
        self._hello_since: set[int] = set()
        self._status: Status | None = None
        self._dirty = False
        self._now = 0.0

    def mark(self, now: float) -> None:
        """The status may have changed: push it with the next frames."""
        self._dirty = True
        self._now = now

    def hello(self, node: int) -> None:
        self._hello_since.add(node)

    def flush(self, book: RoundBook, by_node: dict[int, Member], send: Send, *, sealed: bool) -> None:
        """Push the status to the members of the running round whose answer it changes."""
        if not self._dirty:
            return
        self._dirty = False
        status = book.status(self._now)
        if status == self._status:
            return
        self._status = status
        rnd = book.current
        if rnd is None:
            return
        key = status_key(status)
        # Each join changes the status, rarely the key: then only members that connected since
        # the last pass can be untold (a pass per join over every member is O(N**2) a round).
        audience: Iterable[int] = rnd.members if key != self._key else self._hello_since & rnd.member_set
        self._key, self._hello_since = key, set()
        leaving = [n for n in book.ledger.leavers() if n in by_node and n not in rnd.member_set]
        frame = b""
        digest: bytes | None = None
        for node in itertools.chain(audience, leaving):
            m = by_node.get(node)
            if m is None or m.conn is None or m.told == key or node in book.pending:
                continue
            if not frame:
                frame = StatusPush(status).encode()
                digest = frame_digest(frame) if sealed else None
            m.told = key
            send(m, frame, digest)
