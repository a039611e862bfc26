"""What the election speaks of: a leader's ``Claim`` and how claims rank (``standing``), the
``LeaderView`` a node follows, the events discovery emits, its ``Timing``, the ``Succession``
of a running round, and the counters it keeps. Pure values, read by the election core
(``_protocol``), the node that drives it (``_node``) and the tools (``_doctor``).
"""

from __future__ import annotations

import enum
from collections import Counter

from torch_mingle._record import field, record, replace
from torch_mingle._wire import (
    Announce,
    parse_ip,
    with_scope_of,
)

#: Drop reasons that are normal on a healthy network: counted, never warned about.
QUIET_REASONS = frozenset({"duplicate", "unsigned_probe"})

#: Why another job's datagram fails here, when that job has its own secret or none: not a fault.
OTHER_SECRETS = frozenset({"bad_tag", "missing_tag", "unexpected_tag"})

#: What a drop reason says, for the log line of the first drop of its kind.
DROP_MEANINGS = {
    "bad_tag": "signed with another secret",
    "missing_tag": "unsigned, while this node has a secret",
    "unexpected_tag": "signed, while this node has no secret",
    "bad_version": "another torch_mingle version",
    "outside_replay_window": "signed more than the replay window ago: clocks apart, or a replay",
}

#: A destination: ``None`` is the job's multicast group; otherwise a socket address.
Dest = tuple[object, ...] | None


class Role(enum.Enum):
    IDLE = "idle"
    DISCOVERING = "discovering"
    CLAIMING = "claiming"
    LEADING = "leading"
    FOLLOWING = "following"
    STOPPED = "stopped"


@record
class Claim:
    """A leadership claim: who leads, in which epoch. ``a.beats(b)``: (higher epoch, lower id)."""

    epoch: int
    leader: int

    def key(self) -> tuple[int, int]:
        return (self.epoch, -self.leader)

    def beats(self, other: Claim | None) -> bool:
        return other is None or self.key() > other.key()

    def __str__(self) -> str:
        return f"epoch {self.epoch} leader {self.leader:016x}"


def standing(claim: Claim, established: bool, followers: int = 0) -> tuple[int, int, int, int]:
    """The order of claims: established first, then the higher epoch, then more followers,
    then the lower node id."""
    return (int(established), claim.epoch, followers, -claim.leader)


@record
class LeaderView:
    """What this node knows of the current leader."""

    claim: Claim
    store_ip: str
    store_port: int
    is_self: bool
    heard_at: float
    round: int = 0
    members: int = 0
    closed: bool = False
    established: bool = False
    followers: int = 0
    #: The job closed as failed (``Announce.failed``).
    failed: bool = False

    def standing(self) -> tuple[int, int, int, int]:
        return standing(self.claim, self.established, self.followers)

    @classmethod
    def of(cls, claim: Claim, body: Announce, store_ip: str, *, is_self: bool, now: float) -> LeaderView:
        """The view an announcement (or, for ``is_self``, our own status) gives of its leader."""
        return cls(
            claim=claim,
            store_ip=store_ip,
            store_port=body.store_port,
            is_self=is_self,
            heard_at=now,
            round=body.round,
            members=body.members,
            closed=body.closed,
            failed=body.failed,
            established=body.established,
            followers=body.followers,
        )


@record
class BecomeLeader:
    """This node won the election: the shell must host the store, then call ``leader_ready``."""

    epoch: int


@record
class LeaderFound:
    """A (new) leader is known; ``leader.is_self`` when it is this node."""

    leader: LeaderView


@record
class LeaderLost:
    claim: Claim
    reason: str


@record
class SteppedDown:
    """This node led under ``own`` and yields to the better claim ``winner``."""

    own: Claim
    winner: Claim


Event = BecomeLeader | LeaderFound | LeaderLost | SteppedDown


@record
class Timing:
    """Protocol timers in seconds."""

    election_window_s: float = 0.02
    startup_jitter_s: float = 0.005
    query_retry_s: float = 0.01
    query_retry_max_s: float = 1.0
    claim_wait_s: float = 0.25
    announce_burst_s: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3)
    beacon_interval_s: float = 5.0
    #: How long a leader may be silent: its follower's session (``FollowerSession``), the one
    #: owner of "the leader is silent", drops it then and tells discovery (``leader_failed``).
    leader_timeout_s: float = 15.0
    announce_min_gap_s: float = 0.005
    #: A query is answered by unicast at once; by multicast (for the nodes that stayed silent)
    #: at most this often: when a round of 1,000 loses its leader, every member asks the new
    #: one, and an announcement multicast per query would reach every member each time.
    query_mcast_gap_s: float = 0.1
    candidate_ttl_s: float = 2.5
    suspect_ttl_s: float = 5.0
    #: How long the members of a round wait for the next member in rank order to take over
    #: from their lost leader: it may detect the loss up to one heartbeat later than they do.
    successor_wait_s: float = 5.25
    #: How long the members of a round we took over have to follow us (they heard our
    #: multicast announcement) before each one that does not gets it by unicast.
    fanout_delay_s: float = 0.25

    @classmethod
    def for_keep_alive(cls, election_window_s: float, interval_s: float, attempts: int) -> Timing:
        return cls(
            election_window_s=election_window_s,
            startup_jitter_s=election_window_s / 4,
            claim_wait_s=max(0.25, 4 * election_window_s),
            beacon_interval_s=interval_s,
            leader_timeout_s=interval_s * attempts,
            suspect_ttl_s=interval_s * attempts,
            successor_wait_s=interval_s + max(0.25, 4 * election_window_s),
            fanout_delay_s=max(0.25, 4 * election_window_s),
        )


@record
class Succession:
    """The last round this node is in: its leader's claim, and its members in rank order with
    each one's address and discovery port (as the round lists them; port 0: unknown).

    Addresses are made only when needed (on leader loss): every member of every round gets
    one, and making N of them per member is O(N**2) a round."""

    claim: Claim
    #: The round's number: a leader that announces a later one formed it without this node.
    round: int
    members: tuple[int, ...]
    ips: tuple[str, ...]
    ports: tuple[int, ...]
    #: The leader's address as this node reached it: link-local members share its scope.
    seen_via: str

    def dest_of(self, node: int) -> Dest:
        try:
            return self._dest(self.members.index(node))
        except ValueError:
            return None

    def dests(self) -> list[tuple[int, Dest]]:
        return [(node, self._dest(i)) for i, node in enumerate(self.members)]

    def _dest(self, i: int) -> Dest:
        ip = self.ips[i] if i < len(self.ips) else "?"
        port = self.ports[i] if i < len(self.ports) else 0
        return (with_scope_of(ip, (self.seen_via,)), port) if port and ip != "?" else None


@record
class PeerInfo:
    node: int
    addr: Dest
    last_heard: float
    addrs: tuple[str, ...] = ()


@record(frozen=False)
class Stats:
    """Counters a user can read (``doctor``, debug logs) to see what reached this node."""

    received: int = 0
    accepted: int = 0
    sent: int = 0
    invalid: Counter[str] = field(default_factory=Counter)
    #: The drops among ``invalid`` whose header named this node's job (another secret, say).
    invalid_of_job: Counter[str] = field(default_factory=Counter)
    other_jobs: dict[str, int] = field(default_factory=dict)
    other_jobs_overflow: int = 0
    stale_claims: int = 0

    def dropped_total(self) -> int:
        return sum(n for reason, n in self.invalid.items() if reason not in QUIET_REASONS)

    def copy(self) -> Stats:
        return replace(
            self,
            invalid=self.invalid.copy(),
            invalid_of_job=self.invalid_of_job.copy(),
            other_jobs=dict(self.other_jobs),
        )


def standing_of(claim: Claim | None) -> tuple[int, int, int, int]:
    """The standing of an own claim that has no term yet (nothing at all for None)."""
    return standing(claim, False) if claim is not None else (-1, 0, 0, 0)


def standing_of_body(claim: Claim, body: Announce) -> tuple[int, int, int, int]:
    return standing(claim, body.established, body.followers)


def announced_store_ip(body: Announce, addr: Dest) -> str:
    """The leader's address as this node reaches it.

    A leader that listens on several interfaces announces 0.0.0.0 (or ::): each follower then
    reaches it at the address it heard it from, which is on the follower's own segment. A
    link-local IPv6 address gets the scope of the interface it was heard on.
    """
    try:
        unspecified = parse_ip(body.store_ip).is_unspecified
    except ValueError:
        return body.store_ip
    if unspecified and addr is not None:
        return str(addr[0])
    return with_scope_of(body.store_ip, addr)
