"""Rendezvous rounds, decided without I/O: who is admitted, in which rank order, and when.

How it works
------------
The leader owns a ``RoundBook``. Nodes ask to join (``join``), leave, close the job or
die (reported by the liveness channel). ``decide(now)`` answers ``Form`` (publish a round
with these members now) or ``Wait`` (until a deadline, or until something happens):

* A round needs the leader (it is rank 0, its node hosts the store) and ``min_nodes``.
* It forms at once with ``max_nodes``; beyond that, joiners wait as spares.
* It forms at once when every node expected back has re-joined: on a re-rendezvous
  (worker failure, node loss, new leader) we know who was in the last round, so there is
  nobody to wait for. A new leader learns the last round from the joiners' history.
* Otherwise it forms when ``last_call_timeout`` has passed since ``min_nodes`` was
  reached, exactly as torch's c10d backend does for the first round of a job.

Ranks: the leader is 0; members of the previous round keep their relative order; newcomers
follow in arrival order. Every node reads the same published order, so ranks agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


def node_hex(node: int) -> str:
    return f"{node:016x}"


@dataclass(frozen=True)
class History:
    """The last round a node took part in: lets a new leader recognize a re-rendezvous."""

    epoch: int
    round: int
    members: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "round": self.round, "members": [node_hex(m) for m in self.members]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> History:
        return cls(
            epoch=int(data["epoch"]),
            round=int(data["round"]),
            members=tuple(int(m, 16) for m in data["members"]),
        )


@dataclass(frozen=True)
class JoinRequest:
    node: int
    seq: int
    ip: str
    history: History | None = None


@dataclass(frozen=True)
class Round:
    """A formed round as published on the leader's store."""

    number: int
    epoch: int
    members: tuple[int, ...]
    store_ip: str
    store_port: int
    #: Each member's own address, in rank order (a leader on several networks picks by them).
    ips: tuple[str, ...] = ()

    @property
    def world_size(self) -> int:
        return len(self.members)

    def rank_of(self, node: int) -> int | None:
        try:
            return self.members.index(node)
        except ValueError:
            return None

    def to_json(self) -> dict[str, Any]:
        return {
            "round": self.number,
            "epoch": self.epoch,
            "members": [node_hex(m) for m in self.members],
            "store_ip": self.store_ip,
            "store_port": self.store_port,
            "ips": list(self.ips),
        }

    def encode(self) -> str:
        return json.dumps(self.to_json())

    @classmethod
    def decode(cls, raw: bytes | str) -> Round:
        return cls.from_json(json.loads(raw))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Round:
        return cls(
            number=int(data["round"]),
            epoch=int(data["epoch"]),
            members=tuple(int(m, 16) for m in data["members"]),
            store_ip=str(data["store_ip"]),
            store_port=int(data["store_port"]),
            ips=tuple(str(ip) for ip in data.get("ips", ())),
        )


@dataclass(frozen=True)
class Status:
    """What every node can read cheaply from the leader's store (``num_nodes_waiting``, ``is_closed``)."""

    epoch: int
    round: int
    size: int
    joined: int
    waiting: int
    stale: bool
    closed: bool
    reason: str = ""

    def encode(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def decode(cls, raw: bytes | str) -> Status:
        return cls(**json.loads(raw))


@dataclass(frozen=True)
class Form:
    members: tuple[int, ...]
    admitted: tuple[int, ...]  # event sequence numbers of the admitted join requests
    reason: str
    ips: tuple[str, ...] = ()


@dataclass(frozen=True)
class Wait:
    until: float | None
    reason: str


@dataclass
class RoundBook:
    """The leader's state of the job during its term."""

    leader: int
    epoch: int
    min_nodes: int
    max_nodes: int
    last_call_timeout: float
    pending: dict[int, JoinRequest] = field(default_factory=dict)
    current: Round | None = None
    closed: bool = False
    stale: bool = False
    dead: set[int] = field(default_factory=set)
    left: set[int] = field(default_factory=set)
    last_round_number: int = 0
    _min_reached_at: float | None = None
    _reason: str = "waiting for the first join"

    # ----------------------------------------------------------------- inputs

    def join(self, req: JoinRequest) -> None:
        self.pending[req.node] = req
        self.dead.discard(req.node)
        self.left.discard(req.node)
        if req.history is not None:
            self.last_round_number = max(self.last_round_number, req.history.round)

    def leave(self, node: int) -> None:
        self.left.add(node)
        self.pending.pop(node, None)

    def close(self) -> list[int]:
        """Close the job; returns the sequence numbers of the joins to answer with "closed"."""
        self.closed = True
        seqs = [r.seq for r in self.pending.values()]
        self.pending.clear()
        self._reason = "closed"
        return seqs

    def died(self, node: int) -> int | None:
        """Mark ``node`` dead; returns the sequence number of its pending join, to answer "retry"."""
        self.dead.add(node)
        dropped = self.pending.pop(node, None)
        if self.current is not None and node in self.current.members:
            self.stale = True
        return dropped.seq if dropped is not None else None

    def formed(self, rnd: Round) -> None:
        self.current = rnd
        self.last_round_number = rnd.number
        for node in rnd.members:
            self.pending.pop(node, None)
        self.stale = False
        self._min_reached_at = None

    # --------------------------------------------------------------- decision

    def decide(self, now: float) -> Form | Wait:
        if self.closed:
            return self._wait(None, "closed")
        if self.leader not in self.pending:
            return self._wait(None, "waiting for the leader's own join")
        ordered = self._rank_order()
        admit = ordered[: self.max_nodes]
        n = len(admit)
        if n < self.min_nodes:
            self._min_reached_at = None
            return self._wait(None, f"{n} of min_nodes={self.min_nodes} nodes joined")
        if self._min_reached_at is None:
            self._min_reached_at = now
        if n == self.max_nodes:
            return self._form(admit, f"max_nodes={self.max_nodes} joined")
        expected = self._expected()
        if expected is not None and expected <= self.pending.keys():
            return self._form(admit, "every live node of the last round re-joined")
        deadline = self._min_reached_at + self.last_call_timeout
        if now >= deadline:
            return self._form(admit, f"last call ({self.last_call_timeout:g}s) ended")
        return self._wait(deadline, f"last call: {n} joined, up to max_nodes={self.max_nodes} may still come")

    def _form(self, admit: tuple[int, ...], reason: str) -> Form:
        joins = [self.pending[m] for m in admit]
        return Form(
            members=admit, admitted=tuple(j.seq for j in joins), reason=reason, ips=tuple(j.ip for j in joins)
        )

    def status(self) -> Status:
        size = self.current.world_size if self.current else 0
        return Status(
            epoch=self.epoch,
            round=self.current.number if self.current else 0,
            size=size,
            joined=len(self.pending),
            waiting=self._waiting(),
            stale=self.stale,
            closed=self.closed,
            reason=self._reason,
        )

    def tracked(self) -> set[int]:
        """Nodes whose liveness matters: members of the current round and joiners."""
        members = set(self.current.members) if self.current else set()
        return (members | self.pending.keys()) - self.dead - self.left

    def departed(self) -> set[int]:
        """Members of the current round that left or died."""
        return set(self.current.members) & (self.dead | self.left) if self.current else set()

    def all_gone(self) -> bool:
        """True once every node except the leader has left or died (the leader may then stop)."""
        return not (self.tracked() - {self.leader})

    # ---------------------------------------------------------------- helpers

    def _wait(self, until: float | None, reason: str) -> Wait:
        self._reason = reason
        return Wait(until=until, reason=reason)

    def _latest_history(self) -> History | None:
        histories = [r.history for r in self.pending.values() if r.history is not None]
        return max(histories, key=lambda h: (h.epoch, h.round), default=None)

    def _rank_order(self) -> tuple[int, ...]:
        previous: tuple[int, ...] = ()
        if self.current is not None:
            previous = self.current.members
        else:
            hist = self._latest_history()
            if hist is not None:
                previous = hist.members
        prev_rank = {node: i for i, node in enumerate(previous)}
        others = sorted(
            (n for n in self.pending if n != self.leader),
            key=lambda n: (prev_rank.get(n, len(previous)), self.pending[n].seq),
        )
        return (self.leader, *others)

    def _expected(self) -> set[int] | None:
        if self.current is not None:
            base = set(self.current.members)
        else:
            hist = self._latest_history()
            if hist is None:
                return None  # first round of the job: wait for the last call like c10d
            base = set(hist.members)
            if hist.epoch != self.epoch and hist.members and hist.members[0] != self.leader:
                base.discard(hist.members[0])  # that round's leader is why there is a new term
        return (base - self.dead - self.left) | {self.leader}

    def _waiting(self) -> int:
        if self.closed:
            return 0
        if self.current is None:
            return len(self.pending)
        members = set(self.current.members)
        rejoining = sum(1 for n in self.pending if n in members)
        newcomers = len(self.pending) - rejoining
        live_size = len(members - self.dead - self.left)
        room = max(0, self.max_nodes - live_size)
        return rejoining + min(newcomers, room)
